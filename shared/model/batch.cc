#include "shared/model/batch.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "shared/model/internal/rounds.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::model {
namespace {

// A run of one item's rows through blocks [first, last) at positions
// [start_pos, start_pos + rows) of its slot. A verification has two legs:
// d_K through [0, E) into scratch row K (to_scratch), then scratch rows
// 0..K through [E, L) (from_scratch, read when the leg starts).
struct Leg {
  size_t item = 0;
  int64_t slot = 0, first = 0, last = 0, start_pos = 0, rows = 0;
  at::Tensor h;  // [rows, d]
  // A to_scratch leg's scratch row, fixed when the leg is made: the slot's
  // committed length is never read again during a step, since another
  // process may free the slot meanwhile (a drafter's session cancelled at
  // the verifier: KvCache::Free sets the length to 0) and a second read
  // would put the row elsewhere.
  int64_t scratch_row = 0;
  bool to_scratch = false;
  bool from_scratch = false;
  bool output = false;  // the item's logits come from this leg
};

std::string Str(int64_t x) { return std::to_string(x); }

// The checks of Verifier::Prefill / Step / Verify for one item.
Status CheckWork(const VerifierWork& w, const LlamaModel& model, const KvCache& cache) {
  const int64_t V = model.config().vocab_size, L = model.n_layers();
  if (w.slot < 0 || w.slot >= cache.n_slots()) {
    return InvalidArgumentError("slot: " + Str(w.slot) + " outside [0, " + Str(cache.n_slots()) + ")");
  }
  for (int32_t id : w.tokens) {
    if (id < 0 || id >= V) return InvalidArgumentError("token id " + Str(id) + " outside [0, " + Str(V) + ")");
  }
  const int64_t n = cache.length(w.slot);
  const int64_t T = static_cast<int64_t>(w.tokens.size());
  switch (w.kind) {
    case VerifierWork::Kind::kPrefillChunk:
      if (T == 0) return InvalidArgumentError("prefill chunk is empty");
      if (w.start_pos + T > cache.capacity()) {
        return InvalidArgumentError("prompt has " + Str(w.start_pos + T) +
                                    " tokens, more than the context window of " + Str(cache.capacity()));
      }
      if (w.start_pos != 0 && w.start_pos != n) {
        return FailedPreconditionError("start_pos: chunk at " + Str(w.start_pos) + " but the slot holds " +
                                       Str(n) + " tokens");
      }
      return OkStatus();
    case VerifierWork::Kind::kStep:
      if (T != 1) return InvalidArgumentError("step takes one token");
      if (n >= cache.capacity()) return ResourceExhaustedError("KV slot is full");
      return OkStatus();
    case VerifierWork::Kind::kVerify:
      if (w.exit_layer < 1 || w.exit_layer > L) {
        return InvalidArgumentError("exit_layer " + Str(w.exit_layer) + " outside [1, " + Str(L) + "]");
      }
      if (T > cache.max_draft_len()) {
        return InvalidArgumentError("draft length " + Str(T) + " outside [0, " + Str(cache.max_draft_len()) +
                                    "]");
      }
      if (T == 0 && !w.last_row_ready) {
        return InvalidArgumentError("draft length 0 needs the pending token's hidden state in the scratch");
      }
      if (n + T >= cache.capacity()) return ResourceExhaustedError("KV slot is full");
      return OkStatus();
  }
  return InternalError("unknown work kind");
}

// Runs `legs` through their blocks: the layers in spans over which the set
// of active legs is constant, one LlamaModel::ForwardRagged per span over
// the rows of every leg active there (each layer's weights read once). A
// to_scratch leg leaves its last row's hidden state in the slot's scratch
// row (scratch_row) when it ends; a from_scratch leg reads
// its rows from scratch rows 0.. when it starts. On return each leg's h is
// its rows after its last block.
void RunLegs(const LlamaModel& model, KvCache& cache, std::vector<Leg>& legs) {
  const int64_t L = model.n_layers();
  // Spans of layers over which the set of active legs is constant.
  std::set<int64_t> bounds = {0, L};
  for (const Leg& g : legs) {
    bounds.insert(g.first);
    bounds.insert(g.last);
  }
  auto at_boundary = [&](int64_t b) {
    for (Leg& g : legs) {  // legs that end here hand their row to the scratch
      if (g.to_scratch && g.last == b) {
        cache.exit_hidden().select(0, g.slot).narrow(0, g.scratch_row, 1).copy_(g.h);
      }
    }
    for (Leg& g : legs) {  // legs that start here read it
      if (g.from_scratch && g.first == b) g.h = cache.exit_hidden().select(0, g.slot).narrow(0, 0, g.rows);
    }
  };
  const std::vector<int64_t> b(bounds.begin(), bounds.end());
  for (size_t j = 0; j + 1 < b.size(); ++j) {
    at_boundary(b[j]);
    std::vector<at::Tensor> xs;
    std::vector<RaggedSegment> segs;
    std::vector<Leg*> active;
    for (Leg& g : legs) {
      if (g.first <= b[j] && b[j] < g.last) {
        xs.push_back(g.h);
        segs.push_back(RaggedSegment{g.slot, g.start_pos, g.rows});
        active.push_back(&g);
      }
    }
    if (active.empty()) continue;
    at::Tensor y = model.ForwardRagged(xs.size() == 1 ? xs[0] : at::cat(xs, 0), b[j], b[j + 1], segs, cache);
    int64_t row = 0;
    for (Leg* g : active) {
      g->h = y.narrow(0, row, g->rows);
      row += g->rows;
    }
  }
  at_boundary(L);
}

// The indices of the items of a batch that pass `check` and name a slot no
// earlier item named; the others get their error in `out`.
template <typename Work, typename Result, typename Check>
std::vector<size_t> CheckEach(const std::vector<Work>& work, const Check& check, std::vector<Result>& out) {
  std::vector<size_t> live;
  std::set<int64_t> slots;
  for (size_t i = 0; i < work.size(); ++i) {
    Status s = check(work[i]);
    if (s.ok() && !slots.insert(work[i].slot).second) {
      s = InvalidArgumentError("slot: " + Str(work[i].slot) + " named twice in one batch");
    }
    if (s.ok()) {
      live.push_back(i);
    } else {
      out[i] = s;
    }
  }
  return live;
}

at::Tensor EmbedRows(const LlamaModel& model, const std::vector<int32_t>& ids) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  at::Tensor t = at::tensor(wide, at::TensorOptions().dtype(at::kLong)).view({1, -1}).to(model.options().device);
  return model.Embed(t).view({static_cast<int64_t>(ids.size()), model.config().dim});
}

}  // namespace

std::vector<StatusOr<at::Tensor>> RunVerifierBatch(const LlamaModel& model, KvCache& cache,
                                                   const std::vector<VerifierWork>& work) {
  std::vector<StatusOr<at::Tensor>> out(work.size(), at::Tensor());
  const std::vector<size_t> live =
      CheckEach(work, [&](const VerifierWork& w) { return CheckWork(w, model, cache); }, out);
  if (live.empty()) return out;
  const int64_t L = model.n_layers(), d = model.config().dim;
  Status pass = TorchBoundary("batch", [&]() -> Status {
    c10::InferenceMode inference_mode;
    std::vector<Leg> legs;
    std::vector<int64_t> committed(work.size(), 0);  // new committed length (prefill, step)
    for (size_t i : live) {
      const VerifierWork& w = work[i];
      const int64_t n = cache.length(w.slot);
      const int64_t T = static_cast<int64_t>(w.tokens.size());
      switch (w.kind) {
        case VerifierWork::Kind::kPrefillChunk:
          if (w.start_pos == 0) LEDE_RETURN_IF_ERROR(cache.Truncate(w.slot, 0));
          legs.push_back(Leg{i, w.slot, 0, L, w.start_pos, T, EmbedRows(model, w.tokens)});
          legs.back().output = w.want_logits;
          committed[i] = w.start_pos + T;
          break;
        case VerifierWork::Kind::kStep:
          legs.push_back(Leg{i, w.slot, 0, L, n, 1, EmbedRows(model, w.tokens)});
          legs.back().output = true;
          committed[i] = n + 1;
          break;
        case VerifierWork::Kind::kVerify: {
          if (!w.last_row_ready) {  // d_K through the shallow blocks into scratch row K
            legs.push_back(Leg{i, w.slot, 0, w.exit_layer, n + T, 1, EmbedRows(model, {w.tokens.back()})});
            legs.back().to_scratch = true;
            legs.back().scratch_row = T;
          }
          Leg rows{i, w.slot, w.exit_layer, L, n, T + 1, at::Tensor()};
          rows.from_scratch = true;
          rows.output = true;
          legs.push_back(std::move(rows));
          break;
        }
      }
    }
    RunLegs(model, cache, legs);
    // One LM-head pass over every row that needs logits.
    std::vector<at::Tensor> xs;
    std::vector<int64_t> counts;
    std::vector<const Leg*> heads;
    for (const Leg& g : legs) {
      if (!g.output) continue;
      const bool last_only = work[g.item].kind == VerifierWork::Kind::kPrefillChunk;
      xs.push_back(last_only ? g.h.narrow(0, g.rows - 1, 1) : g.h);
      counts.push_back(last_only ? 1 : g.rows);
      heads.push_back(&g);
    }
    if (!xs.empty()) {
      at::Tensor logits = model.ExitLogitsRagged(at::cat(xs, 0).view({-1, d}), counts);
      int64_t row = 0;
      for (size_t k = 0; k < heads.size(); ++k) {
        const VerifierWork& w = work[heads[k]->item];
        at::Tensor l = logits.narrow(0, row, counts[k]);
        out[heads[k]->item] = w.kind == VerifierWork::Kind::kVerify ? l : l.view({-1});
        row += counts[k];
      }
    }
    for (size_t i : live) {
      if (committed[i] > 0) LEDE_RETURN_IF_ERROR(cache.Commit(work[i].slot, committed[i]));
    }
    return OkStatus();
  });
  if (!pass.ok()) {
    for (size_t i : live) out[i] = pass;
  }
  return out;
}

Status ValidateDraftWork(const LlamaModel& model, const KvCache& cache, const DraftWork& w) {
  const int64_t L = model.n_layers(), d = model.config().dim, V = model.config().vocab_size;
  if (w.slot < 0 || w.slot >= cache.n_slots()) {
    return InvalidArgumentError("slot: " + Str(w.slot) + " outside [0, " + Str(cache.n_slots()) + ")");
  }
  if (w.first < 0 || w.first >= w.last || w.last > L) {
    return InvalidArgumentError("blocks [" + Str(w.first) + ", " + Str(w.last) + ") outside 0 <= first < last <= " +
                                Str(L));
  }
  if (w.row < 0 || w.row >= cache.max_draft_len()) {
    return InvalidArgumentError("draft row " + Str(w.row) + " outside [0, " + Str(cache.max_draft_len()) + ")");
  }
  if (!w.hidden.defined() && (w.token < 0 || w.token >= V)) {
    return InvalidArgumentError("token id " + Str(w.token) + " outside [0, " + Str(V) + ")");
  }
  if (w.hidden.defined() && w.hidden.numel() != d) {
    return InvalidArgumentError("hidden state of " + Str(w.hidden.numel()) + " values, not d = " + Str(d));
  }
  if (cache.length(w.slot) + w.row >= cache.capacity()) return ResourceExhaustedError("KV slot is full");
  return OkStatus();
}

namespace {

// One checked step alone: LlamaModel::Forward (which takes the CUDA graph
// of its shape where graphs are on) and ExitLogits.
DraftStepResult DraftOne(const LlamaModel& model, KvCache& cache, const DraftWork& w) {
  const int64_t d = model.config().dim;
  at::Tensor h = w.hidden.defined() ? w.hidden.reshape({1, 1, d}) : EmbedRows(model, {w.token}).view({1, 1, d});
  DraftStepResult r;
  r.hidden = model.Forward(h, w.first, w.last, cache.length(w.slot) + w.row, &cache, w.slot);
  cache.exit_hidden().select(0, w.slot).narrow(0, w.row, 1).copy_(r.hidden.view({1, d}));
  r.exit_logits = model.ExitLogits(r.hidden).view({-1});
  return r;
}

}  // namespace

StatusOr<DraftStepResult> RunDraftStep(const LlamaModel& model, KvCache& cache, const DraftWork& work) {
  LEDE_RETURN_IF_ERROR(ValidateDraftWork(model, cache, work));
  return TorchBoundary("draft", [&]() -> StatusOr<DraftStepResult> {
    c10::InferenceMode inference_mode;
    return DraftOne(model, cache, work);
  });
}

std::vector<StatusOr<DraftStepResult>> RunDrafterBatch(const LlamaModel& model, KvCache& cache,
                                                       const std::vector<DraftWork>& work) {
  std::vector<StatusOr<DraftStepResult>> out(work.size(), DraftStepResult{});
  const int64_t d = model.config().dim;
  const std::vector<size_t> live =
      CheckEach(work, [&](const DraftWork& w) { return ValidateDraftWork(model, cache, w); }, out);
  if (live.empty()) return out;
  Status pass = TorchBoundary("draft batch", [&]() -> Status {
    c10::InferenceMode inference_mode;
    if (live.size() == 1) {  // a batch of one is the solo step (no ragged bookkeeping)
      out[live[0]] = DraftOne(model, cache, work[live[0]]);
      return OkStatus();
    }
    std::vector<Leg> legs;
    for (size_t i : live) {
      const DraftWork& w = work[i];
      at::Tensor h = w.hidden.defined() ? w.hidden.reshape({1, d}) : EmbedRows(model, {w.token});
      legs.push_back(Leg{i, w.slot, w.first, w.last, cache.length(w.slot) + w.row, 1, std::move(h)});
      legs.back().to_scratch = true;
      legs.back().scratch_row = w.row;
      legs.back().output = true;
    }
    RunLegs(model, cache, legs);
    std::vector<at::Tensor> xs;
    for (const Leg& g : legs) xs.push_back(g.h);
    at::Tensor logits = model.ExitLogitsRagged(at::cat(xs, 0), std::vector<int64_t>(legs.size(), 1));
    for (size_t k = 0; k < legs.size(); ++k) {
      out[legs[k].item] = DraftStepResult{legs[k].h.view({1, 1, d}), logits.select(0, static_cast<int64_t>(k))};
    }
    return OkStatus();
  });
  if (!pass.ok()) {
    // One item's fault must not fail the others' steps: a draft commits
    // nothing, so each one runs again alone and only a faulty one fails.
    for (size_t i : live) out[i] = RunDraftStep(model, cache, work[i]);
  }
  return out;
}

std::vector<BatchResult> RunBatch(const LlamaModel& model, KvCache& cache, const std::vector<BatchItem>& items) {
  std::vector<BatchResult> results(items.size());
  std::vector<VerifierWork> work;
  std::vector<size_t> work_item;      // item of each work entry
  std::vector<int64_t> start_length;  // committed length before the step, per work entry
  const int64_t V = model.config().vocab_size;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (it.slot < 0 || it.slot >= cache.n_slots()) {
      results[i].status = InvalidArgumentError("slot: " + Str(it.slot) + " outside [0, " + Str(cache.n_slots()) + ")");
      continue;
    }
    VerifierWork w;
    w.slot = it.slot;
    if (it.kind == BatchItem::Kind::kPrefill) {
      const int64_t P = it.prompt == nullptr ? 0 : static_cast<int64_t>(it.prompt->size());
      Status s;
      if (P == 0) {
        s = InvalidArgumentError("prompt is empty");
      } else if (it.chunk_start < 0 || it.chunk_len < 1 || it.chunk_start + it.chunk_len > P) {
        s = InvalidArgumentError("chunk: [" + Str(it.chunk_start) + ", " + Str(it.chunk_start + it.chunk_len) +
                                 ") outside the prompt of " + Str(P) + " tokens");
      } else if (it.chunk_start == 0) {  // the whole prompt is checked up front, as Prefill does
        if (P > cache.capacity()) {
          s = InvalidArgumentError("prompt has " + Str(P) + " tokens, more than the context window of " +
                                   Str(cache.capacity()));
        }
        for (int32_t id : *it.prompt) {
          if (s.ok() && (id < 0 || id >= V)) {
            s = InvalidArgumentError("prompt token id " + Str(id) + " outside [0, " + Str(V) + ")");
          }
        }
      }
      if (!s.ok()) {
        results[i].status = s;
        continue;
      }
      w.kind = VerifierWork::Kind::kPrefillChunk;
      w.tokens.assign(it.prompt->begin() + it.chunk_start, it.prompt->begin() + it.chunk_start + it.chunk_len);
      w.start_pos = it.chunk_start;
      w.want_logits = it.chunk_start + it.chunk_len == P;
    } else {
      const speculation::Draft& dr = it.draft;
      const int64_t K = static_cast<int64_t>(dr.tokens.size());
      if (K == 0 && dr.ready_layer == 0) {
        w.kind = VerifierWork::Kind::kStep;
        w.tokens = {it.pending_token};
      } else {
        if (Status s = internal::CheckRound(dr, it.draft_probs, it.options); !s.ok()) {
          results[i].status = s;
          continue;
        }
        w.kind = VerifierWork::Kind::kVerify;
        w.tokens = dr.tokens;
        w.exit_layer = K == 0 ? dr.ready_layer : dr.exit_layer;
        w.last_row_ready = dr.ready_layer != 0;
      }
    }
    work_item.push_back(i);
    start_length.push_back(cache.length(it.slot));
    work.push_back(std::move(w));
  }
  std::vector<StatusOr<at::Tensor>> logits = RunVerifierBatch(model, cache, work);
  c10::InferenceMode inference_mode;
  for (size_t k = 0; k < work.size(); ++k) {
    const BatchItem& it = items[work_item[k]];
    BatchResult& r = results[work_item[k]];
    if (!logits[k].ok()) {
      r.status = logits[k].status();
      continue;
    }
    if (it.kind == BatchItem::Kind::kPrefill) {
      if (!work[k].want_logits) continue;
      StatusOr<speculation::Prefilled> first =
          internal::FirstToken(*logits[k], it.slot, static_cast<int64_t>(it.prompt->size()), it.options);
      if (!first.ok()) {
        r.status = first.status();
        continue;
      }
      r.prefilled = true;
      r.first = *std::move(first);
    } else {
      StatusOr<speculation::Verdict> v = internal::FinishRound(cache, it.slot, start_length[k], it.draft,
                                                               it.draft_probs, it.options, *logits[k]);
      if (!v.ok()) {
        r.status = v.status();
        continue;
      }
      r.verdict = *std::move(v);
    }
  }
  return results;
}

}  // namespace lede::model
