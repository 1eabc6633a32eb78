#!/usr/bin/env python3
"""The ceiling of continuous batching on this machine for a served workload.

How much faster can 16 autoregressive streams run batched than one sequence
per pass (`--max-batch 1`) on this 2-core machine, for the same requests? The
services cannot beat the engine: this measures the engine's step costs with
both cores busy, as the services run them, and prices a serving benchmark's
workload with them.

It runs build/bench/lede_batch_bench twice at once, pinned to cores 0 and 1
(each process times the same step: the two cores then share the memory bus
as two batch workers do), for
  - a decode step of 1 row (what each of the two handler threads runs at
    --max-batch 1),
  - a decode step of R rows (--rows, default 8: the two batch workers each
    run half of 16 streams at the verifier's default --batch-split-rows 8),
  - a decode step of P rows (--prefill-rows, default 28, the tokens of a
    prompt of the story set), whose cost per row stands for a prompt
    token's: both run every layer for each row and are bound by computing,
    batched or not (a prompt's own attention over its other tokens is
    left out; at 28 tokens it is small beside the products),
and, as the other plan (the verifier's --batch-threads 2 --batch-workers 1),
one lede_batch_bench process on 2 intra-op threads timing one step of all
--concurrency streams and one of P rows (core-ms = 2 x wall). Each cost is
taken at the better of the two plans, so the ceiling holds for either
schedule. It reads the prompt and output token counts of the autoregressive rows of a
serve_bench JSON (--serve-json; its rows with max_batch 1 and above 1 at
--concurrency). The ceiling of a row is its tokens over the time two cores
need for its prefill rows and decode steps at those costs:

  ceiling tok/s = output / ((prompt x prefill_ms_per_row + output x step_ms / rows) / 2 cores)

With a LEDE row at --concurrency (max_batch above 1) in the JSON it also
prices LEDE's rounds (at the better plan again: half the sessions per
pinned batch worker, or all of them on 2 threads), each round one
verification of K + 1 rows from exit layer E and K draft steps of blocks
[0, E), at the row's mean exit layer and draft length (rounded), and
1 + acceptance x draft length tokens per round; the LEDE ceiling over the
batched autoregressive ceiling bounds LEDE's speed-up at that concurrency.
It also reports the tokens per round, and so the acceptance rate at that
draft length, that LEDE's rounds would need for their ceiling to reach
--lede-target (default 1.2) times the autoregressive one (above 1: none).

The baseline is priced twice: at the 1-row step with both cores stepping
(its two handler threads share the memory bus) and at the 1-row step alone
(they never overlap); the truth lies between, and so does the ratio's
ceiling.

This leaves out everything but the steps (the coordinator, the client, gRPC,
the ramp while the first prompts are read, the drain while the last requests
run alone), so each ceiling is above what any scheduler reaches; their ratio
bounds the batched / --max-batch 1 speed-up of that workload.

The costs move with this VM's memory bus from run to run (a 1-row step with
both cores busy took 14 to 22 ms in one hour), so it measures --repeats
passes and reports each, and the range. Prints the costs and ceilings;
--json writes them (bench/record.py adds
command, commit and machine). Nothing here asserts.

usage: bench/batching_ceiling.py --model out/w5t --serve-json bench/results/serve-widen5-fixes.json
                                 [--concurrency 16] [--rows 8] [--prefill-rows 28] [--iters 100] [--repeats 3]
                                 [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pinned(bench, model, work, sessions, iters, cores=(0, 1), k=3, exit_layer=2):
    """ms per batched step of `work` with `sessions` sessions (k drafts each for verify, at exit_layer), one
    lede_batch_bench process pinned to each of `cores`, all at once: the mean of their batched times, and each.
    cores=(0,) times the step alone, the other core left idle."""
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for core in cores:
            out = os.path.join(tmp, "core%d.json" % core)
            cmd = ["taskset", "-c", str(core), bench, "--model", model, "--work", work, "--batches", str(sessions),
                   "--k", str(k), "--exit-layer", str(exit_layer), "--iters", str(iters), "--json", out]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL))
            outs.append(out)
        for p in procs:
            if p.wait() != 0:
                sys.exit("batching_ceiling.py: lede_batch_bench failed: exit %d" % p.returncode)
        ms = []
        for out in outs:
            with open(out) as f:
                ms.append(json.load(f)["rows"][0]["batched_ms"])
    return sum(ms) / len(ms), ms


def threaded(bench, model, work, sessions, iters, k=3, exit_layer=2, threads=2):
    """ms per batched step of `work` with `sessions` sessions run by one lede_batch_bench process on `threads`
    intra-op threads (the products split by output columns: each core reads its share of the weights once for
    all rows; the verifier's --batch-threads 2 --batch-workers 1)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "threaded.json")
        cmd = [bench, "--model", model, "--work", work, "--batches", str(sessions), "--k", str(k), "--exit-layer",
               str(exit_layer), "--iters", str(iters), "--threads", str(threads), "--json", out]
        if subprocess.call(cmd, cwd=ROOT, stdout=subprocess.DEVNULL) != 0:
            sys.exit("batching_ceiling.py: lede_batch_bench --threads %d failed" % threads)
        with open(out) as f:
            return json.load(f)["rows"][0]["batched_ms"]


def one_pass(a, bench, serve, solo, batched):
    """One measurement of the step costs and the ceilings they give (see the file comment)."""
    one_row, one_row_cores = pinned(bench, a.model, "step", 1, a.iters)
    one_row_alone, _ = pinned(bench, a.model, "step", 1, a.iters, cores=(0,))
    batch_step, batch_cores = pinned(bench, a.model, "step", a.rows, a.iters)
    prefill, prefill_cores = pinned(bench, a.model, "step", a.prefill_rows, max(10, a.iters // 5))
    # The other plan: one step of all the streams on both cores (core-ms = 2 x its wall time).
    step_threaded = threaded(bench, a.model, "step", a.concurrency, a.iters)
    prefill_threaded = threaded(bench, a.model, "step", a.prefill_rows, max(10, a.iters // 5))
    # Each cost at the better plan: a ceiling is the best any schedule reaches.
    prefill_row = min(prefill / a.prefill_rows, 2 * prefill_threaded / a.prefill_rows)
    batch_token = min(batch_step / a.rows, 2 * step_threaded / a.concurrency)

    def ceiling(r, step_ms_per_token):
        core_ms = r["prompt_tokens"] * prefill_row + r["output_tokens"] * step_ms_per_token
        return r["output_tokens"] / (core_ms / 2 / 1e3)

    out_rows = []
    for s, b in zip(solo, batched):
        c_solo, c_batched = ceiling(s, one_row), ceiling(b, batch_token)
        # The two handler threads of --max-batch 1 do not always step at once (each waits for its session's
        # round trip): priced at the lone step, as if they never shared the memory bus, the baseline's
        # ceiling is higher and the ratio's lower.
        c_solo_alone = ceiling(s, one_row_alone)
        out_rows.append({
            "concurrency": a.concurrency, "prompt_tokens": b["prompt_tokens"], "output_tokens": b["output_tokens"],
            "requests": b["completed"],
            "ceiling_tok_s": {"max_batch_1": c_solo, "batched": c_batched},
            "measured_tok_s": {"max_batch_1": s["output_tokens_per_s"], "batched": b["output_tokens_per_s"]},
            "ceiling_ratio": c_batched / c_solo,
            "max_batch_1_ceiling_at_lone_step_tok_s": c_solo_alone,
            "ceiling_ratio_at_lone_step": c_batched / c_solo_alone,
            "measured_ratio": b["output_tokens_per_s"] / s["output_tokens_per_s"]})

    lede_rows = [r for r in serve["rows"] if r["method"] == "lede" and r["concurrency"] == a.concurrency
                 and r["max_batch"] > 1 and r.get("mean_draft_length")]
    lede = None
    if lede_rows:
        # LEDE's rounds at this concurrency, at their mean exit layer and draft length: each batch worker
        # verifies half the sessions' K + 1 rows in one step and drafts K steps of blocks [0, E) for them.
        r = lede_rows[0]
        E, K = max(1, round(r["mean_exit_layer"])), max(1, round(r["mean_draft_length"]))
        half = max(1, a.concurrency // 2)
        verify_ms, _ = pinned(bench, a.model, "verify", half, a.iters, k=K, exit_layer=E)
        draft_ms, _ = pinned(bench, a.model, "draft", half, a.iters, k=K, exit_layer=E)
        tokens_per_round = 1 + r["acceptance_rate"] * r["mean_draft_length"]
        verify_threaded = threaded(bench, a.model, "verify", a.concurrency, a.iters, k=K, exit_layer=E)
        draft_threaded = threaded(bench, a.model, "draft", a.concurrency, a.iters, k=K, exit_layer=E)
        round_ms = min((verify_ms + K * draft_ms) / half,  # core-ms per session's round, at the better plan
                       2 * (verify_threaded + K * draft_threaded) / a.concurrency)
        core_ms = r["prompt_tokens"] * prefill_row + r["output_tokens"] / tokens_per_round * round_ms
        c_lede = r["output_tokens"] / (core_ms / 2 / 1e3)
        c_ar = ceiling(batched[0], batch_token)
        # The tokens per round (and so the acceptance rate at this draft length) LEDE's rounds would need for
        # its ceiling to reach --lede-target times the autoregressive one on the same requests:
        #   P p + O r / t <= (P p + O a) / target  <=>  t >= O r / ((P p + O a) / target - P p).
        prompt_ms = r["prompt_tokens"] * prefill_row
        room = (prompt_ms + r["output_tokens"] * batch_token) / a.lede_target - prompt_ms
        t_needed = r["output_tokens"] * round_ms / room if room > 0 else float("inf")
        lede = {"exit_layer": E, "draft_length": K, "tokens_per_round": tokens_per_round,
                "acceptance_rate": r["acceptance_rate"],
                "verify_ms": verify_ms, "draft_step_ms": draft_ms, "sessions_per_step": half,
                "threaded_verify_ms": verify_threaded, "threaded_draft_step_ms": draft_threaded,
                "round_core_ms_per_session": round_ms,
                "prompt_tokens": r["prompt_tokens"], "output_tokens": r["output_tokens"],
                "ceiling_tok_s": c_lede, "measured_tok_s": r["output_tokens_per_s"],
                "ceiling_over_autoregressive_ceiling": c_lede / c_ar,
                "target": a.lede_target, "tokens_per_round_for_target": t_needed,
                # above 1: no acceptance rate at this draft length reaches the target
                "acceptance_for_target": (t_needed - 1) / K,
                "measured_over_autoregressive": r["output_tokens_per_s"] / batched[0]["output_tokens_per_s"]}
    return {"step_ms": {"one_row": one_row, "one_row_per_core": one_row_cores, "one_row_alone": one_row_alone,
                        "batched": batch_step, "batched_per_core": batch_cores,
                        "prefill": prefill, "prefill_per_core": prefill_cores, "prefill_per_row": prefill_row,
                        "threaded_batched": step_threaded, "threaded_prefill": prefill_threaded,
                        "batched_core_ms_per_token": batch_token},
            "rows": out_rows, "lede": lede}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="out/w5t")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--serve-json", required=True, help="serve_bench JSON whose autoregressive rows to price")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rows", type=int, default=8, help="rows of each of the two batched decode steps")
    ap.add_argument("--prefill-rows", type=int, default=28, help="rows of the prefill-like step")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="measurement passes (this VM's memory bus is noisy)")
    ap.add_argument("--lede-target", type=float, default=1.2,
                    help="LEDE over batched autoregressive speed-up whose required acceptance rate to report")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.rows < 1 or a.prefill_rows < 2 or a.iters < 1 or a.repeats < 1:
        sys.exit("batching_ceiling.py: --rows >= 1, --prefill-rows >= 2, --iters >= 1 and --repeats >= 1")
    bench = os.path.join(a.build, "bench", "lede_batch_bench")
    with open(a.serve_json) as f:
        serve = json.load(f)
    rows = [r for r in serve["rows"] if r["method"] == "autoregressive" and r["concurrency"] == a.concurrency]
    solo = [r for r in rows if r["max_batch"] == 1]
    batched = [r for r in rows if r["max_batch"] > 1]
    if not solo or not batched or any("prompt_tokens" not in r for r in rows):
        sys.exit("batching_ceiling.py: %s has no autoregressive rows at concurrency %d with max_batch 1 and "
                 "above, with prompt_tokens (as the current serve_bench.py writes them)" % (a.serve_json, a.concurrency))

    passes = []
    for i in range(a.repeats):
        p = one_pass(a, bench, serve, solo, batched)
        passes.append(p)
        st = p["step_ms"]
        print("pass %d, both cores busy: decode step of 1 row %.2f ms (alone %.2f), %d rows %.2f ms, %d rows %.2f ms; "
              "on 2 threads: %d rows %.2f ms, %d rows %.2f ms; best plan: %.2f core-ms per decode token, %.2f per "
              "prompt token" % (i + 1, st["one_row"], st["one_row_alone"], a.rows, st["batched"], a.prefill_rows,
                                st["prefill"], a.concurrency, st["threaded_batched"], a.prefill_rows,
                                st["threaded_prefill"], st["batched_core_ms_per_token"], st["prefill_per_row"]))
        for row in p["rows"]:
            print("  %d requests, %d prompt and %d output tokens: ceiling %.1f tok/s batched, %.1f at --max-batch 1 "
                  "(%.1f at the lone step), ratio %.2fx (%.2fx at the lone step); measured %.1f and %.1f (%.2fx)"
                  % (row["requests"], row["prompt_tokens"], row["output_tokens"], row["ceiling_tok_s"]["batched"],
                     row["ceiling_tok_s"]["max_batch_1"], row["max_batch_1_ceiling_at_lone_step_tok_s"],
                     row["ceiling_ratio"], row["ceiling_ratio_at_lone_step"], row["measured_tok_s"]["batched"],
                     row["measured_tok_s"]["max_batch_1"], row["measured_ratio"]))
        lede = p["lede"]
        if lede:
            print("  LEDE at %d streams (E=%d, K=%d, %.2f tokens per round): verify %.2f ms, draft step %.2f ms per %d "
                  "sessions; ceiling %.1f tok/s = %.2fx the batched autoregressive ceiling; measured %.2fx batched "
                  "autoregressive" % (a.concurrency, lede["exit_layer"], lede["draft_length"], lede["tokens_per_round"],
                                      lede["verify_ms"], lede["draft_step_ms"], lede["sessions_per_step"],
                                      lede["ceiling_tok_s"], lede["ceiling_over_autoregressive_ceiling"],
                                      lede["measured_over_autoregressive"]))
            print("  %.2fx would take %.2f tokens per round at K=%d: an acceptance rate of %.2f (served: %.3f)"
                  % (lede["target"], lede["tokens_per_round_for_target"], lede["draft_length"],
                     lede["acceptance_for_target"], lede["acceptance_rate"]))
    ratios = [r["ceiling_ratio_at_lone_step"] for p in passes for r in p["rows"]] + \
             [r["ceiling_ratio"] for p in passes for r in p["rows"]]
    lede_ratios = [p["lede"]["ceiling_over_autoregressive_ceiling"] for p in passes if p["lede"]]
    summary = {"batched_over_max_batch_1_ceiling": [min(ratios), max(ratios)],
               "lede_over_autoregressive_ceiling": [min(lede_ratios), max(lede_ratios)] if lede_ratios else None}
    print("batched / --max-batch 1 ceiling over the passes: %.2fx - %.2fx" % tuple(summary[
        "batched_over_max_batch_1_ceiling"]))
    if lede_ratios:
        print("LEDE / batched autoregressive ceiling over the passes: %.2fx - %.2fx" % tuple(summary[
            "lede_over_autoregressive_ceiling"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "serve_json": a.serve_json, "rows_per_step": a.rows,
                       "prefill_rows": a.prefill_rows, "iters": a.iters, "concurrency": a.concurrency,
                       "passes": passes, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
