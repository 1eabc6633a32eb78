#!/usr/bin/python3
"""Renders every measured table of the docs from the JSON the benchmarks wrote.

usage: scripts/make_docs_tables.py          rewrite the generated tables in place
       scripts/make_docs_tables.py --check  exit 1, naming each, if a table is not what its JSON renders to

A generated table sits between two marker comments in README.md, docs/*.md or
models/lede-tiny/README.md:

    <!-- table: bench/results/lede-tiny-bench.json summary policies=accelerator-v7,measured-v9 -->
    ...generated, never typed...
    <!-- /table -->

The marker names the JSON (a path from the repository root), then an optional
view and key=value options; `command=yes` also prints the command that
reproduces the JSON (COMMANDS below). The block holds a line naming that file
and its provenance (the command, commit, date and machine that bench/record.py
stored in it), then the table. A table renders only from a JSON that exists
and was recorded at a commit without local changes (no `-dirty`): anything
else is an error naming the file. How results are recorded and retired:
bench/results/README.md.
"""
import glob
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_GLOBS = ("README.md", "docs/*.md", "models/lede-tiny/README.md")
MARKER = re.compile(r"<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- /table -->", re.S)
PROVENANCE_KEYS = ("command", "commit", "date", "machine")

MODEL = "models/lede-tiny"
_POLICIES = ",".join(f"{MODEL}/policy/{p}" for p in ("accelerator-v7", "measured-v9", "story-accelerator-v5",
                                                     "story-measured-v8"))
_WIDEN5 = "build/services/cli/lede widen --model models/lede-tiny --factor 5 --out out/w5t --overwrite"


def _bench_set(name):
    return (f"build/bench/lede-bench bench --model {MODEL} --calibration {MODEL}/calibration-cpu.json "
            f"--prompts {MODEL}/prompts/{name}.jsonl --candidate-layers 1,2,3,4,5,6 --policy {_POLICIES} "
            f"--max-draft-len 6 --prompts-per-set 48 --new-tokens 64 --threads 1 --json {{json}}")


# Each result a table uses: what kind of JSON it holds, and the command that writes it.
COMMANDS = {
    "bench/results/lede-tiny-bench.json":
        ("lede-bench bench", "bench/record.py bench/results/lede-tiny-bench.json -- \\\n    "
         + _bench_set("story") + " -- \\\n    " + _bench_set("code")),
    "bench/results/lede-tiny-eval-exits.json":
        ("lede-eval-exits", "bench/record.py bench/results/lede-tiny-eval-exits.json -- build/trainer/lede-eval-exits "
         f"--model {MODEL} --calibration {MODEL}/calibration-cpu.json "
         "--data out/corpus/stories.val.txt,out/corpus/code.val.txt --exit-layers 1,2,3,4,6 --draft-lens 1,2,3,4,6 "
         "--prompts 24 --new-tokens 64 --threads 1 --out {json}"),
    "bench/results/lede-tiny-eval-sources.json":
        ("eval-sources", "scripts/eval_by_source.sh   # after scripts/train_lede_tiny.sh"),
    "bench/results/lede-tiny-weight-formats.json":
        ("weight_formats_quality", "for w in f32 bf16 q8_0; do build/trainer/lede-eval-exits --model models/lede-tiny "
         "--calibration models/lede-tiny/calibration-cpu.json --data testdata/corpus/tinystories_val_a.txt "
         "--exit-layers 2 --draft-lens 3 --prompts 4 --new-tokens 32 --eval-tokens 16384 --threads 1 --weights $w "
         "--out /tmp/evq/$w.json; done   # then the per-layer tables combined into one file"),
    "bench/results/llamacpp-w5-trained.json":
        ("llamacpp_bench", "scripts/install_node_llama_cpp.sh\n" + _WIDEN5 + "\n"
         "node bench/llamacpp_bench.mjs --model out/w5t --policy out/w5t/policy --formats f32,bf16,q8_0 --threads 1 \\\n"
         "    --tokens 96 --repeats 3 --eval-prompts 8 --tuning-prompts 4 --static 1:3,1:4,2:2,2:3,2:4,3:3,3:4 \\\n"
         "    --out bench/results/llamacpp-w5-trained.json"),
    "bench/results/serve-widen5-fixes.json":
        ("serve_bench", _WIDEN5 + "\n"
         "bench/record.py bench/results/serve-widen5-fixes.json -- /usr/bin/python3 bench/serve_bench.py \\\n"
         "    --model out/w5t --prompt-file models/lede-tiny/prompts/story.jsonl --deployments split \\\n"
         "    --methods autoregressive,lede --concurrency 1,16 --max-batch 1,16 --num-prompts 32 --new-tokens 64 \\\n"
         "    --check-solo 24 --json '{json}'"),
    "bench/results/engine_bench-memory-w5.json":
        ("lede_engine_bench isolated", "build/services/cli/lede widen --model models/lede-tiny --factor 5 --out out/w5\n"
         "bench/record.py bench/results/engine_bench-memory-w5.json -- build/bench/lede_engine_bench \\\n"
         "    --models out/w5 --kernels fused --weights f32,bf16,q8_0 --isolate --repeats 5 --tokens 64 \\\n"
         "    --threads 1 --no-gemv --json {json}"),
    "bench/results/engine_bench-memory-llama32-1b.json":
        ("lede_engine_bench isolated", "scripts/smoke_llama32_1b.sh   # once: writes build/smoke/llama32-1b\n"
         "bench/record.py bench/results/engine_bench-memory-llama32-1b.json -- build/bench/lede_engine_bench \\\n"
         "    --models build/smoke/llama32-1b --kernels fused --weights bf16,q8_0 --isolate --repeats 3 --tokens 32 \\\n"
         "    --threads 1 --no-gemv --json {json}"),
    "bench/results/retrain-acceptance.json":
        ("retrain acceptance", "bench/retrain_bench.py acceptance"),
    "bench/results/retrain-widened.json":
        ("retrain widened", "bench/retrain_bench.py widened --traffic 100 --eval-prompts 6 --rounds 3   "
         "# the issue's full loop: --traffic 200"),
    "bench/results/hostile_clients.json":
        ("hostile_clients", "bench/record.py bench/results/hostile_clients.json -- bench/hostile_clients_bench.py \\\n"
         "    --slow 200 --trickle-s 2 --hold-s 30 --requests 10 --ports-base 4700 --json {json}"),
    "bench/results/cancel_storm.json":
        ("cancel_storm", "bench/record.py bench/results/cancel_storm.json -- bench/cancel_storm_bench.py \\\n"
         "    --runs 3 --cancels 300 --ports-base 4900 --json {json}"),
    # The demo model's training report (lede-pretrain writes it with the model) and its policies'
    # artifacts (policy/*/policy.json: offline metrics of each shipped version).
    f"{MODEL}/report.json": ("pretrain report", "scripts/train_lede_tiny.sh 1200 1 2100 2"),
    f"{MODEL}/policy": ("policy artifacts", "scripts/train_policies.sh"),
}


class DocsError(Exception):
    pass


def load(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def x(v, digits=2):
    return f"{v:.{digits}f}x"


def num(v, fmt="{:,.0f}"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# --- lede-bench bench -------------------------------------------------------

RULE_FAMILIES = ("threshold", "calibrated", "del", "adaedl")


def _tuned(rows, family):
    """The rows of `family` tuned on the tuning half ("static (best accelerator)", ...)."""
    return [r for r in rows if r["method"].startswith(family + " (best ")]


def _best(rows, key):
    return max(rows, key=lambda r: r[key]) if rows else None


def bench_summary(data, opts):
    """One row per prompt set and metric: the best static and rule-based settings (each family tuned on the
    tuning half, per cost model; the better of the two tunings on the metric), the LEDE policy of `policies`
    trained for that metric's cost model, and the hindsight oracle."""
    policies = [p for p in opts.get("policies", "").split(",") if p]
    metrics = (("wall-clock, this CPU", "measured_speedup", "measured", "measured"),
               ("accelerator model (predicted)", "predicted_speedup_accelerator", "accelerator", "accelerator"))
    out = []
    for name, s in data["sets"].items():
        rows = s["rows"]
        for label, key, cost_model, oracle in metrics:
            static = _best(_tuned(rows, "static"), key)
            rule = _best([r for f in RULE_FAMILIES for r in _tuned(rows, f)], key)
            lede = [r for r in rows for p in policies
                    if r["method"] == "lede " + p and r["config"].endswith(f"({cost_model})")]
            lede = lede[0] if lede else None
            cells = [name, label, f"{num(s['ar_tokens_per_s'])} tok/s",
                     f"{x(static[key])} ({static['config']})" if static else "-",
                     f"{x(rule[key])} ({rule['method'].split(' ')[0]} {rule['config']})" if rule else "-",
                     f"{x(lede[key])} ({lede['method'][5:]})" if lede else "-",
                     x(lede[key] / static[key], 3) if lede and static else "-",
                     x(lede[key] / rule[key], 3) if lede and rule else "-",
                     x(s["hindsight_oracle"][oracle]) if s.get("hindsight_oracle") else "-"]
            out.append(cells)
    return table(["set", "speed-up over autoregressive", "autoregressive", "best static", "best rule-based",
                  "LEDE", "LEDE / static", "LEDE / rule", "hindsight oracle (predicted)"], out)


def bench_full(data, opts):
    out = []
    for name, s in data["sets"].items():
        out.append(f"### {name} ({s['eval_prompts']} prompts; AR {s['ar_tokens_per_s']:.0f} tokens/s)\n")
        out.append("| method | config | tokens/s | measured | pred. accel. | pred. measured | acceptance | "
                   "tokens/round | mean exit | mean D | exact match |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in s["rows"]:
            out.append(f"| {r['method']} | {r['config']} | {r['tokens_per_s']:.0f} | {r['measured_speedup']:.2f}x | "
                       f"{r['predicted_speedup_accelerator']:.2f}x | {r['predicted_speedup_measured']:.2f}x | "
                       f"{r['acceptance_rate']:.3f} | {r['tokens_per_round']:.2f} | {r['mean_exit_layer']:.2f} | "
                       f"{r['mean_draft_len']:.2f} | {r['exact_match_rate']:.2f} |")
        for key, label in (("calibrated_ceiling", "calibrated (in-sample)"),
                           ("belief_ceiling_tuning_fit", "belief (tuning fit)"),
                           ("belief_ceiling_in_sample", "belief (in-sample)")):
            c = s.get(key)
            if c:
                out.append(f"| ceiling: {label} | | | | {c['accelerator']:.2f}x | {c['measured']:.2f}x | | | | | |")
        o = s["hindsight_oracle"]
        out.append(f"| ceiling: hindsight oracle | | | | {o['accelerator']:.2f}x | {o['measured']:.2f}x | | | | | |\n")
    return "\n".join(out).rstrip("\n")


# --- lede-bench load ----------------------------------------------------------

def load_table(data, opts):
    out = []
    for name, rows in data["sets"].items():
        versions = sorted({v for r in rows for v in r.get("lede", {})})
        header = ["cost model", "load B", "static tuned at B", "static tuned alone"]
        for v in versions:
            header += [f"LEDE {v}", f"{v} under its max load C"]
        body = []
        for r in rows:
            cells = [r["cost_model"], r["load"],
                     f"{x(r['static_tuned_at_load']['speedup'], 3)} ({r['static_tuned_at_load']['setting']})",
                     f"{x(r['static_tuned_alone']['speedup'], 3)} ({r['static_tuned_alone']['setting']})"]
            for v in versions:
                capped = r["lede_max_load"][v]
                c = "-" if capped["max_load"] is None else capped["max_load"]
                cells += [x(r["lede"][v], 3), f"{x(capped['speedup'], 3)} (C={c})"]
            body.append(cells)
        out.append(f"**{name}** ({data['new_tokens']} new tokens, ridge {data['ridge_tokens']} tokens)\n")
        out.append(table(header, body) + "\n")
    return "\n".join(out).rstrip("\n")


# --- lede-eval-exits -------------------------------------------------------

def eval_exits(data, opts):
    cal = data["calibration"]
    rounds = ""
    if cal.get("round_us"):
        rounds = ("; rounds priced from real rounds timed in the decoding loop, in autoregressive rounds of "
                  f"{cal['ar_step_us']:.0f} us: K drafts at E=2 and their verification take "
                  + ", ".join(f"{v / cal['ar_step_us']:.2f}" for v in cal["round_us"][1][:6]) + " for K = 1..6")
    out = [f"Greedy, prompts cut from held-out documents. Cost models (docs/design.md §1): *accelerator* "
           f"(verification costs one step; the LM head is h = {data['head_layer_equivalents']:.2f} "
           f"layer-equivalents) and *measured* (this CPU: full step {cal['step_us']:.0f} us; one block "
           f"{cal['block_us'][0]:.0f} us for 1 position, {cal['block_us'][3]:.0f} us for 4, "
           f"{cal['block_us'][15]:.0f} us for 16{rounds}).\n"]
    for dom, r in data["domains"].items():
        g = r["static_grid"]
        out.append(f"### {dom} ({g['prompts']} prompts x {g['new_tokens']} tokens; AR "
                   f"{g['ar']['tokens_per_s']:.0f} tokens/s)\n")
        out.append("| E | D | acceptance | tokens/round | tokens/s | measured | predicted accel. | predicted measured |")
        out.append("|---|---|---|---|---|---|---|---|")
        for row in g["static"]:
            out.append(f"| {row['exit_layer']} | {row['draft_len']} | {row['acceptance_rate']:.3f} | "
                       f"{row['tokens_per_round']:.2f} | {row['tokens_per_s']:.0f} | {row['measured_speedup']:.2f}x | "
                       f"{row['predicted_speedup_accelerator']:.2f}x | {row['predicted_speedup_measured']:.2f}x |")
        b = g["best_accelerator"]
        out.append(f"\nBest under the accelerator model: E={b['exit_layer']}, D={b['draft_len']}: "
                   f"{b['predicted_speedup_accelerator']:.2f}x predicted, {b['measured_speedup']:.2f}x measured "
                   f"wall-clock on this CPU.\n")
    return "\n".join(out).rstrip("\n")


def eval_sources(data, opts):
    out = ["| source | tokens | stage 1 ppl | final ppl | stage 1 agree@2 | final agree@2 | stage 1 agree@4 | "
           "final agree@4 |", "|---|---|---|---|---|---|---|---|"]
    for dom in data["final"]:
        a, b = data["stage 1"][dom], data["final"][dom]
        out.append(f"| {dom} | {b['tokens']} | {a['perplexity'][-1]:.2f} | {b['perplexity'][-1]:.2f} | "
                   f"{a['top1_agreement_with_last'][1]:.3f} | {b['top1_agreement_with_last'][1]:.3f} | "
                   f"{a['top1_agreement_with_last'][3]:.3f} | {b['top1_agreement_with_last'][3]:.3f} |")
    return "\n".join(out)


# --- the training report ----------------------------------------------------

def report_exits(data, opts):
    doms = list(data["held_out"].keys())
    n_layers = len(data["held_out"][doms[0]]["perplexity"])
    out = ["| layer | " + " | ".join(f"{d} ppl | {d} agree" for d in doms) + " |", "|---|" + "---|---|" * len(doms)]
    for l in range(n_layers):
        cells = []
        for d in doms:
            h = data["held_out"][d]
            cells += [f"{h['perplexity'][l]:.1f}", f"{h['top1_agreement_with_last'][l]:.3f}"]
        out.append(f"| {l + 1} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def report_stage2(data, opts, path):
    stage1 = load(os.path.join(os.path.dirname(path), "report_stage1.json"))
    a, b = stage1["held_out"]["stories"], data["held_out"]["stories"]
    out = ["| layer | stage 1 ppl | stage 1 agree | final ppl | final agree |", "|---|---|---|---|---|"]
    for l in range(len(b["perplexity"])):
        out.append(f"| {l + 1} | {a['perplexity'][l]:.1f} | {a['top1_agreement_with_last'][l]:.3f} | "
                   f"{b['perplexity'][l]:.1f} | {b['top1_agreement_with_last'][l]:.3f} |")
    return "\n".join(out)


def policies_table(data, opts):
    out = ["| version | reward cost model | rho | candidate layers | D_max | probes (phase 1 / lookahead) | "
           "transitions | selection speed-up (replay) |", "|---|---|---|---|---|---|---|---|"]
    for m in data:
        rho = m.get("training_options", {}).get("rho")
        sel = m["offline_metrics"].get("selection_speedup")
        out.append(f"| {m['version']} | {m['reward']['cost_model']} | {rho if rho is None else f'{rho:.3f}'} | "
                   f"{m['candidate_layers']} | {m['max_draft_len']} | "
                   f"{m.get('probe_candidates', True)} / {m.get('lookahead_probe', True)} | "
                   f"{m['training_data']['n_transitions']} | {sel if sel is None else f'{sel:.3f}x'} |")
    return "\n".join(out)


# --- services and micro-benchmarks -------------------------------------------

def serve_table(data, opts):
    def ms(d, k, f="{:.1f}"):
        return num(d.get(k), f)
    body = []
    # Runs merged from several settings (bench/record.py -- A -- B) name each row's batch threads and workers.
    plans = any("batch_threads" in r for r in data["rows"])
    for r in data["rows"]:
        plan = [f"{r.get('batch_threads', '-')} x {r.get('batch_workers', '-')}"] if plans else []
        body.append([r["deployment"], r["max_batch"]] + plan + [r["method"], r["concurrency"], r["completed"],
                     num(r["request_throughput"], "{:.2f}"), num(r["output_tokens_per_s"]),
                     f"{ms(r['ttft'], 'mean_ms')} / {ms(r['ttft'], 'p99_ms')}",
                     f"{ms(r['tpot'], 'mean_ms', '{:.2f}')} / {ms(r['tpot'], 'p99_ms', '{:.2f}')}",
                     f"{ms(r['itl'], 'mean_ms', '{:.2f}')} / {ms(r['itl'], 'p99_ms', '{:.2f}')}",
                     num(r.get("acceptance_rate"), "{:.3f}"),
                     num(r.get("sessions_per_step", {}).get("verifier"), "{:.1f}")])
    checks = "".join(
        f"\n\n{c['requests']} {c['method']} requests at once on {data['slots']} slots (max batch "
        f"{c['max_batch']}): {c['completed']} completed, {c['equal_to_solo']} equal to their solo runs"
        + (f" ({c['requests'] - c['solo_completed']} of the solo runs failed"
           + (f": {', '.join(sorted(set(c['solo_failed'].values())))}" if c.get("solo_failed") else "") + ")"
           if c.get("solo_completed", c["requests"]) < c["requests"] else "") + "."
        for c in data.get("solo_checks", []))
    head = ["deployment", "max batch"] + (["batch threads x workers"] if plans else [])
    return (f"{data['prompts']} prompts, {data['new_tokens']} new tokens, {data['slots']} KV slots; times in ms "
            "(mean / p99); sessions per verifier step.\n\n"
            + table(head + ["method", "clients", "done", "req/s", "output tok/s", "TTFT",
                     "TPOT", "ITL", "acceptance", "sessions/step"], body) + checks)


def services_table(data, opts):
    body = [[r["deployment"], r["method"], num(r["decode_tokens_per_s"], "{:.1f}"),
             num(r["ratio_to_in_process"], "{:.0%}") if r["ratio_to_in_process"] is not None else "-",
             num(r["client_tokens_per_s"], "{:.1f}"), num(r["acceptance_rate"], "{:.3f}")] for r in data["rows"]]
    return (f"{data['prompts']} prompts x {data['new_tokens']} new tokens, greedy. Same tokens split and "
            f"co-located: {'yes' if data['same_tokens_split_colocated'] else 'NO'}; with remote decisions: "
            f"{'yes' if data['same_tokens_remote'] else 'NO'}.\n\n"
            + table(["deployment", "method", "decode tok/s", "vs in-process", "client tok/s", "acceptance"], body))


def engine_table(data, opts):
    r = data["roofline"]
    body = [[os.path.basename(row["model"].rstrip("/")), row["method"], row["kernels"], row.get("weights", "f32"),
             num(row["tokens_per_s"], "{:,.1f}"), num(row["weight_gb_per_s"], "{:.1f}"),
             f"{100 * row['share_of_read_roofline']:.0f}%", num(row["gflop_per_s"], "{:.1f}"),
             "yes" if row["greedy_ids_same_as_first_of_format"] else "NO"] for row in data["rows"]]
    return (f"Greedy from BOS, {data['tokens']} new tokens, {data['threads']} thread(s), medians of "
            f"{data['repeats']} interleaved runs. Roofline measured in the same run: reading 256 MiB "
            f"{r['dram_read_gb_per_s']:.1f} GB/s, 16 MiB {r['llc_read_gb_per_s']:.1f} GB/s; sgemm 512^3 "
            f"{r['sgemm_gflop_per_s']:.1f} GFLOP/s.\n\n"
            + table(["model", "method", "kernels", "weights", "tok/s", "weight GB/s", "of the read roofline",
                     "GFLOP/s", "same greedy ids"], body))


def engine_isolated_table(data, opts):
    gib = 1024 ** 3
    body = []
    for r in data["isolated"]:
        vs = r.get("tokens_per_s_vs_f32") or 0
        vs_cpu = r.get("tokens_per_cpu_s_vs_f32") or 0
        def spread(runs, fmt="{:,.1f}", scale=1):
            return f"{fmt.format(min(runs) * scale)}-{fmt.format(max(runs) * scale)}" if runs else "-"

        body.append([os.path.basename(r["model"].rstrip("/")), r["weights"], num(r["load_s"], "{:.1f}"),
                     num(r["peak_rss_bytes_after_load"] / gib, "{:.2f}"), num(r["peak_rss_bytes"] / gib, "{:.2f}"),
                     num(r["resident_weight_bytes"] / gib, "{:.2f}"),
                     num(r["tokens_per_s"], "{:,.1f}") + (f" ({x(vs)})" if vs else "")
                     + f" [{spread(r['tokens_per_s_runs'])}]",
                     num(r["weight_gb_per_s"], "{:.1f}"),
                     f"{100 * r['share_of_read_roofline']:.0f}% [{spread(r['share_of_read_roofline_runs'], '{:.0f}', 100)}%]",
                     num(r["tokens_per_cpu_s"], "{:,.1f}") + (f" ({x(vs_cpu)})" if vs_cpu else "")
                     + f" [{spread(r['tokens_per_cpu_s_runs'])}]",
                     f"{100 * r['share_of_read_roofline_per_cpu_s']:.0f}% "
                     f"[{spread(r['share_of_read_roofline_per_cpu_s_runs'], '{:.0f}', 100)}%]", r["rounds"]])
    return (f"Fused kernels, greedy autoregressive from BOS, {data['tokens']} new tokens, {data['threads']} "
            f"thread(s); each weight format in a process of its own, {data['repeats']} rounds interleaved, "
            "medians [range over the rounds] (peak RSS: the largest, getrusage). Each process measures the read roofline (256 MiB) "
            "before its load and after its decode; a run's share is its weight GB/s (packed bytes of a step x "
            "tok/s) over the mean of the two. \"per CPU s\" counts the decoding thread's CPU time instead of "
            "the wall clock (the roofline's too): what a core nobody else shares would do.\n\n"
            + table(["model", "weights", "load s", "peak RSS after load, GiB", "peak RSS, GiB",
                     "weights held, GiB", "tok/s (vs f32)", "weight GB/s", "of the read roofline",
                     "tok per CPU s (vs f32)", "of the roofline, per CPU s", "rounds"], body))


def batch_table(data, opts):
    body = [[r["sessions"], r["work"], num(r["batched_ms"], "{:.3f}"), num(r["solo_ms"], "{:.3f}"),
             x(r["speedup"])] for r in data["rows"]]
    return (f"{data['model']}, context {data['context']}, K={data['k']} drafts at E={data['exit_layer']}, "
            f"{data['threads']} thread(s); ms per step.\n\n"
            + table(["sessions B", "work", "one batched step", "B solo calls", "speed-up"], body))


def policy_table(data, opts):
    return table(["Q-network hidden width", "ns per decision"],
                 [[r["hidden"], num(r["ns_per_decision"], "{:.1f}")] for r in data["rows"]])


def replica_table(data, opts):
    return table(["replicas", "ns per placement", "placements/s"],
                 [[r["replicas"], num(r["ns_per_placement"], "{:.1f}"), num(r["placements_per_s"])]
                  for r in data["rows"]])


def hostile_clients_table(data, opts):
    ok = sum(1 for st in data["statuses"] if st == 200)
    t, f = data["coordinator_threads"], data["coordinator_fds"]
    return table(["slow connections", "completions answered", "slowest completion, s",
                  "coordinator threads (before / max / after)", "descriptors (before / max / after)",
                  "slow connections cut by the deadline"],
                 [[data["slow_connections"], f"{ok} of {len(data['statuses'])}", num(data["latency_max_s"], "{:.3f}"),
                   f"{t['before']} / {t['max_during']} / {t['after']}", f"{f['before']} / {f['max_during']} / {f['after']}",
                   data["slow_connections_cut_and_reopened"]]])


def cancel_storm_table(data, opts):
    rows = []
    for i, r in enumerate(data["runs"], 1):
        g, s = r["greedy"], r["storm"]
        rows.append([i, s["started"], s["cancelled"], g["requests"], g["failed"], g["differ"]])
    return table(["run", "sampled streams", "cancelled after the first token", "greedy requests", "greedy failed",
                  "greedy differing from solo"], rows)


_LLAMACPP_METHODS = (("llamacpp_ar", "llama.cpp autoregressive"),
                     ("llamacpp_prompt_lookup", "llama.cpp prompt lookup (InputLookupTokenPredictor)"),
                     ("lede_ar", "our autoregressive"), ("lede_static", "our best static"),
                     ("lede_lede", "our LEDE"))


def llamacpp_heldout_table(data, opts):
    """The held-out-prompts run (results with `methods`): one row per method."""
    rows, checks = [], []
    for r in data["results"]:
        for key, label in _LLAMACPP_METHODS:
            m = r["methods"].get(key)
            if not m:
                continue
            if key == "lede_static":
                label += f" (E={m['exit_layer']} D={m['draft_len']})"
            if key == "lede_lede":
                label += f" (`{m['policy']}`)"
            v = m["vs_llamacpp_ar"]
            gbs = (f"{m['effective_gb_s']:.1f} ({100 * m['share_of_roofline']:.0f}%)"
                   if m.get("share_of_roofline") is not None else "-")
            rows.append([r["format"], r["threads"], label,
                         f"{num(m['median_tok_s'])} ({num(m['min_tok_s'])}-{num(m['max_tok_s'])})",
                         f"{x(v['median'])} ({v['min']:.2f}-{v['max']:.2f})", gbs])
        c, n = r["checks"], r["checks"]["prompts"]
        frac = lambda k: "-" if c.get(k) is None else f"{c[k]}/{n}"  # noqa: E731
        checks.append([r["format"], r["threads"], num(r["bytes"] / 1e6, "{:.1f}"),
                       f"{frac('same_greedy_text_f32_compute')} / {frac('same_greedy_text_native')}",
                       f"{frac('llamacpp_lookup_lossless')} / {frac('lede_static_lossless')} / {frac('lede_lede_lossless')}"])
    s, roof = data["settings"], data.get("roofline") or {}
    reads = len(roof.get("measurements") or [])
    roof_text = (f"; read roofline {roof['used_gb_per_s']:.1f} GB/s (one core, `lede_engine_bench --roofline-only`"
                 + (f", the best of {reads} reads during the run" if reads else "") + ")"
                 if roof.get("used_gb_per_s") else "")
    return (f"Greedy, {s['tokens']} tokens on each of {len(s['eval_prompts'])} held-out prompts ({s['prompts']}); "
            f"tok/s = tokens / decode seconds of a pass over all of them, median (range) of {s['repeats']} "
            f"interleaved passes; \"vs llama.cpp\" is per pass against llama.cpp autoregressive in the same pass; "
            f"static swept over E:D {s['static_sweep']} on the tuning prompts; GB/s = weight bytes per token x tok/s "
            f"(autoregressive rows){roof_text}; both engines read the same GGUF file; peer: "
            f"{data['peer']['package']} {data['peer']['version']}.\n\n"
            + table(["format", "threads", "method", "tok/s", "vs llama.cpp autoregressive",
                     "GB/s (share of read roofline)"], rows)
            + "\n\n"
            + table(["format", "threads", "file MB",
                     "same greedy text as llama.cpp (ours on the file's weights in f32 / in the file's storage)",
                     "lossless vs the engine's autoregressive text (llama.cpp lookup / our static / our LEDE)"],
                    checks))


def llamacpp_table(data, opts):
    if data["results"] and "methods" in data["results"][0]:
        return llamacpp_heldout_table(data, opts)
    rows = []
    for r in data["results"]:
        l = r["lede"]
        peer = r["llamacpp"]["median_tok_s"]
        rows.append([r["format"], r["threads"], num(r["bytes"] / 1e6, "{:.1f}"), num(peer),
                     num(l["ar"]["median_tok_s"]), x(l["ar"]["median_tok_s"] / peer),
                     f"{num(l['static']['median_tok_s'])} ({l['static'].get('exit_layer_draft_len', '')})",
                     num(l["lede"]["median_tok_s"]), x(l["lede"]["median_tok_s"] / peer),
                     ("yes" if r.get("same_greedy_text") else "no")
                     + (f" / {'yes' if r['same_greedy_text_native'] else 'no'}" if "same_greedy_text_native" in r else "")])
    s = data["settings"]
    return (f"Greedy, {s['tokens']} tokens from \"{s['prompt']}\", medians of {s['repeats']} runs (decode only); "
            f"both engines read the same GGUF file; peer: {data['peer']['package']} {data['peer']['version']}.\n\n"
            + table(["format", "threads", "file MB", "llama.cpp tok/s", "our autoregressive tok/s",
                     "autoregressive vs llama.cpp", "our static tok/s (E, D)", "our LEDE tok/s", "LEDE vs llama.cpp",
                     "same greedy text as llama.cpp (the file's weights in f32 / in the file's storage)"],
                    rows))


def weight_formats_table(data, opts):
    f = data["formats"]
    base = f["f32"]
    rows = []
    for name, r in f.items():
        ppl, agree = r["perplexity"], r["top1_agreement_with_last"]
        rows.append([name, f"{ppl[-1]:.3f}", f"{100 * (ppl[-1] / base['perplexity'][-1] - 1):+.2f}%",
                     f"{100 * agree[1]:.1f}%", f"{100 * (agree[1] - base['top1_agreement_with_last'][1]):+.1f}",
                     f"{ppl[1]:.2f}"])
    return (f"{data['model']} on {base['tokens']} held-out tokens of `{data['data']}`.\n\n"
            + table(["weights", "perplexity (last layer)", "vs f32", "layer-2 top-1 agreement with the last layer",
                     "vs f32, points", "layer-2 perplexity"], rows))


def retrain_acceptance_table(data, opts):
    h, t, tr = data["heldout_replay"], data["targets"], data["traffic"]
    first, second = data["first_once"], data["second_once"]
    rows = []
    if "published" in h:
        rows.append([f"retrained on the traffic ({h['published']['version']})", x(h["published"]["speedup"], 3), "",
                     ""])
    for key, name in (("best_static", f"best static setting, tuned on the tuning half ({h['best_static']['config']})"),
                      ("shipped_code_aware", f"shipped offline-trained code-aware policy ({h['shipped_code_aware']['version']})"),
                      ("cold_start", f"cold start ({h['cold_start']['version']})")):
        ratio = h["published"]["speedup"] / h[key]["speedup"] if "published" in h else float("nan")
        target = {"best_static": t.get("published_over_best_static"),
                  "shipped_code_aware": t.get("published_over_shipped")}.get(key)
        rows.append([name, x(h[key]["speedup"], 3), x(ratio, 3),
                     "" if not target else f">= {target['target']}x: {'met' if target['met'] else 'missed'}"])
    p = data["prompts"]
    return (f"{tr['requests']} greedy requests ({tr['new_tokens']} tokens, default method, served by "
            f"{', '.join(tr['served_policy_versions'])}) from rows {p['traffic_rows']} of `{p['file']}`; "
            f"`lede-train --once` with no other flags: {first['decision']} in {first['wall_s']:.0f} s "
            f"({first['report'].get('train_requests', '?')} training, {first['report'].get('heldout_requests', '?')} "
            f"held-out requests); a second `--once`: {second['decision']}. Replayed on rows {p['heldout_rows']} "
            f"({p['tuning_prompts']} tune the static baseline, {p['eval_prompts']} evaluate), accelerator cost model, "
            f"speed-up over autoregressive decoding on the evaluation half.\n\n"
            + table(["policy", "speed-up", "retrained / this", "target"], rows))


def retrain_scale_table(data, opts):
    tr, o = data["traffic"], data["once"]
    return table(["logged requests", "tokens", "requests trained and evaluated", "`--once` wall, one core",
                  "CPU", "peak RSS", "decision"],
                 [[tr["requests"], num(tr["tokens"]), data.get("requests_trained_and_evaluated", "?"),
                   f"{data['wall_s']:.0f} s", f"{data['cpu_s']:.0f} s", f"{data['peak_rss_mib']:,.0f} MiB",
                   o["decision"]]])


def retrain_widened_table(data, opts):
    tr, o, h, env = data["traffic"], data["once"], data["heldout"], data["serve_env"]
    cold = tr["cold_start"]
    report = o.get("report", {})
    factor = re.search(r"--factor (\d+)", data["model_copy"]).group(1)
    lines = [f"{tr['requests']} requests through `scripts/run` ({tr['greedy']} greedy, {tr['sampled']} at temperature "
             f"{tr['temperature']:g}, {tr['new_tokens']} tokens, one stream) on lede-tiny widened "
             f"(`lede widen --factor {factor}`, its policy "
             f"removed), at "
             f"LEDE_WEIGHTS={env['LEDE_WEIGHTS']} LEDE_THREADS={env['LEDE_THREADS']}, served by the cold start "
             f"`{tr['cold_start_version']}` (static E={int(cold['exit_layer'])} D={int(cold['draft_len'])}, "
             f"self-calibrated); prompts: {data['prompts']['traffic']}. `lede-train --once` with no other flags: "
             f"{o['decision']} `{data.get('published_version') or '-'}` in {o['wall_s']:.0f} s, priced by "
             f"`{report.get('cost_model', '?')}` ({report.get('train_requests', '?')} training, "
             f"{report.get('heldout_requests', '?')} held-out requests). Then {h['rounds']} rounds of deployments of "
             f"each policy (order rotating), each timing {h['prompts']} held-out prompts "
             f"({data['prompts']['heldout']}), {h['new_tokens']} tokens, greedy, the default method and "
             f"autoregressive decoding interleaved per prompt.", "", ""]
    rows = [[r.get("round", 0) + 1, f"`{r['serving']}`", f"{r['tok_s']['default']:.1f}",
             f"{r['tok_s']['autoregressive']:.1f}", f"{r['speedup']:.3f}x", r["lossless"]] for r in data["served"]]
    t = table(["round", "serving policy", "default method tok/s", "autoregressive tok/s", "speed-up",
               "same text as autoregressive"], rows)
    ratio_rows = []
    for pair, v in data.get("ratios", {}).items():
        s, d = v["speedup"], v["default_tok_s"]
        ratio_rows.append([pair.replace(" / ", " over "), f"**{s['median']:.3f}x** [{s['min']:.3f}, {s['max']:.3f}]",
                           f"{d['median']:.3f}x [{d['min']:.3f}, {d['max']:.3f}]"])
    t2 = table(["policies", "served speed-up ratio, median [range] over rounds",
                "default-method tok/s ratio, median [range]"], ratio_rows)
    tail = []
    for k, v in data.get("targets", {}).items():
        tail.append(f"- {k.replace('_', ' ')}: {v['value']} (target >= {v.get('target', '-')}: "
                    f"{'met' if v['met'] else 'missed'})")
    return "\n".join(lines) + t + "\n\n" + t2 + ("\n\n" + "\n".join(tail) if tail else "")


def batching_ceiling_table(data, opts):
    threaded = "threaded_batched" in data["passes"][0]["step_ms"]  # priced at the better of two plans
    lines = [f"Engine step costs with both cores busy (two `lede_batch_bench` processes pinned to the two cores; "
             f"the 1-row step also alone), per pass; ceilings price the rows of `{data['serve_json']}` at "
             f"{data.get('concurrency', 16)} streams with them: steps only (no coordinator, client, ramp or drain), "
             f"the baseline at the 1-row step alone and with both cores stepping."
             + (" Each batched cost at the better of two plans: two pinned steps of half the streams, or one step "
                "of all of them on 2 threads (`--batch-threads 2 --batch-workers 1`; core-ms = 2 x wall)."
                if threaded else ""), "", ""]
    rows = []
    needs = any("acceptance_for_target" in (p.get("lede") or {}) for p in data["passes"])
    target = next((p["lede"]["target"] for p in data["passes"] if "target" in (p.get("lede") or {})), None)
    for i, p in enumerate(data["passes"], 1):
        st = p["step_ms"]
        for r in p["rows"]:
            lede = p.get("lede") or {}
            rows.append([i, f"{st['one_row_alone']:.1f} / {st['one_row']:.1f}",
                         f"{st['batched']:.1f}" + (f" / {st['threaded_batched']:.1f}" if threaded else ""),
                         f"{st['prefill_per_row']:.2f}",
                         f"{r['max_batch_1_ceiling_at_lone_step_tok_s']:.0f} - {r['ceiling_tok_s']['max_batch_1']:.0f}",
                         f"{r['ceiling_tok_s']['batched']:.0f}",
                         f"{r['ceiling_ratio_at_lone_step']:.2f}x - {r['ceiling_ratio']:.2f}x",
                         f"{r['measured_tok_s']['max_batch_1']:.1f} / {r['measured_tok_s']['batched']:.1f}",
                         f"{r['measured_ratio']:.2f}x",
                         f"{lede['ceiling_over_autoregressive_ceiling']:.2f}x" if lede else "-",
                         f"{lede['measured_over_autoregressive']:.2f}x" if lede else "-"]
                        + ([f"{lede['acceptance_for_target']:.2f} ({lede['acceptance_rate']:.3f})"
                            if "acceptance_for_target" in lede else "-"] if needs else []))
    step_head = (f"{data['rows_per_step']}-row step ms" + (f" / {data.get('concurrency', 16)} rows on 2 threads"
                                                            if threaded else ""))
    t = table(["pass", "1-row step ms, alone / both cores", step_head,
               "ms per prompt token", "ceiling tok/s, max batch 1", "ceiling tok/s, batched",
               "ceiling ratio", "measured tok/s, max batch 1 / batched", "measured ratio",
               "LEDE ceiling / batched AR ceiling", "LEDE measured / batched AR"]
              + ([f"acceptance LEDE needs for {target:.1f}x (served)"] if needs else []), rows)
    sm = data["summary"]
    tail = (f"\n\nCeiling of batched / `--max-batch 1` over the passes: "
            f"**{sm['batched_over_max_batch_1_ceiling'][0]:.2f}x - {sm['batched_over_max_batch_1_ceiling'][1]:.2f}x**.")
    if sm.get("lede_over_autoregressive_ceiling"):
        lo, hi = sm["lede_over_autoregressive_ceiling"]
        tail += (f" LEDE over batched autoregressive decoding at {data.get('concurrency', 16)} streams: ceiling "
                 f"**{lo:.2f}x - {hi:.2f}x**.")
    return "\n".join(lines) + t + tail


# kind -> {view -> renderer(data, opts)}; the first view is the default.
RENDERERS = {
    "lede-bench bench": {"full": bench_full, "summary": bench_summary},
    "lede-bench load": {"table": load_table},
    "lede-eval-exits": {"grid": eval_exits},
    "eval-sources": {"table": eval_sources},
    "pretrain report": {"exits": report_exits, "stage2": None},
    "policy artifacts": {"table": policies_table},
    "serve_bench": {"table": serve_table},
    "services_bench": {"table": services_table},
    "lede_engine_bench": {"table": engine_table},
    "lede_engine_bench isolated": {"table": engine_isolated_table},
    "lede_batch_bench": {"table": batch_table},
    "lede_policy_bench": {"table": policy_table},
    "lede_replica_bench": {"table": replica_table},
    "hostile_clients": {"table": hostile_clients_table},
    "cancel_storm": {"table": cancel_storm_table},
    "llamacpp_bench": {"table": llamacpp_table},
    "weight_formats_quality": {"table": weight_formats_table},
    "retrain acceptance": {"table": retrain_acceptance_table},
    "retrain scale": {"table": retrain_scale_table},
    "retrain widened": {"table": retrain_widened_table},
    "batching ceiling": {"table": batching_ceiling_table},
}


def machine_text(m):
    if not isinstance(m, dict):
        return str(m)
    parts = [m.get("cpu", "?")]
    if m.get("cores"):
        parts.append(f"{m['cores']} cores")
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']:g} GiB")
    parts.append(", ".join(m["gpus"]) if m.get("gpus") else "no GPU")
    if m.get("os"):
        parts.append(m["os"])
    return ", ".join(parts)


def parse_spec(spec):
    words = spec.split()
    if not words:
        raise DocsError("a table marker names no file")
    path, view, opts = words[0], None, {}
    for w in words[1:]:
        if "=" in w:
            k, _, v = w.partition("=")
            opts[k] = v
        elif view is None:
            view = w
        else:
            raise DocsError(f"table {path}: two views ({view}, {w})")
    return path, view, opts


def render(doc, spec):
    """The body of the block `<!-- table: spec -->` in the file `doc` (both relative to the root)."""
    path, view, opts = parse_spec(spec)
    if path not in COMMANDS:
        raise DocsError(f"{doc}: table {path}: not a known result (scripts/make_docs_tables.py COMMANDS)")
    kind, command = COMMANDS[path]
    views = RENDERERS[kind]
    view = view or next(iter(views))
    if view not in views:
        raise DocsError(f"{doc}: table {path}: no view {view!r} (have {', '.join(views)})")
    show_command = opts.pop("command", "no") == "yes"
    link = os.path.relpath(os.path.join(ROOT, path), os.path.dirname(os.path.join(ROOT, doc)))
    if not os.path.exists(os.path.join(ROOT, path)):
        raise DocsError(f"{doc}: table {path}: the file does not exist; record it first:\n{command}")
    if kind == "policy artifacts":  # a directory: every version's policy.json
        data = [load(os.path.relpath(p, ROOT))
                for p in sorted(glob.glob(os.path.join(ROOT, path, "*", "policy.json")))]
        source = (f"*Generated by `scripts/make_docs_tables.py` from the policy.json of every version in "
                  f"[{path}]({link}).*")
        return f"{source}\n\n{views[view](data, opts)}\n"
    data = load(path)
    if path.startswith("bench/results/"):
        missing = [k for k in PROVENANCE_KEYS if k not in data]
        if missing:
            raise DocsError(f"{path}: no {', '.join(missing)} (write it with bench/record.py)")
        commit = str(data["commit"])
        if commit.endswith("-dirty"):
            raise DocsError(f"{doc}: table {path}: recorded at {commit}, a tree with local changes; "
                            "record it again at a commit")
        short = commit[:10]
        source = (f"*Generated by `scripts/make_docs_tables.py` from [{path}]({link}) (commit `{short}`, "
                  f"{str(data['date'])[:10]}, {machine_text(data['machine'])}), which records the command"
                  + (" and how its provenance was reconstructed" if data.get("provenance_note") else "") + ".*")
    else:
        source = f"*Generated by `scripts/make_docs_tables.py` from [{path}]({link}).*"
    if kind == "pretrain report" and view == "stage2":
        stage1 = os.path.join(os.path.dirname(path), "report_stage1.json")
        source = (f"*Generated by `scripts/make_docs_tables.py` from [{stage1}]({os.path.join(os.path.dirname(link), 'report_stage1.json')}) "
                  f"and [{path}]({link}).*")
        body = report_stage2(data, opts, path)
    else:
        body = views[view](data, opts)
    if show_command:
        body += f"\n\nReproduce:\n\n```sh\n{command}\n```"
    return f"{source}\n\n{body}\n"


def block(doc, spec):
    return f"<!-- table: {spec} -->\n{render(doc, spec)}<!-- /table -->"


def docs():
    out = []
    for pattern in DOC_GLOBS:
        out += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))
    return out


def process(check):
    """Rewrites (or, with check, compares) every generated block; returns the stale ones."""
    stale = []
    for doc in docs():
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            text = f.read()

        def sub(m):
            want = render(doc, m.group("spec"))
            if m.group("body") != want:
                stale.append(f"{doc}: table {m.group('spec').split()[0]}")
            return f"<!-- table: {m.group('spec')} -->\n{want}<!-- /table -->"

        new = MARKER.sub(sub, text)
        if not check and new != text:
            with open(os.path.join(ROOT, doc), "w", encoding="utf-8") as f:
                f.write(new)
    return stale


def main(argv):
    check = "--check" in argv[1:]
    try:
        stale = process(check)
    except (DocsError, OSError, KeyError, ValueError) as e:
        print(f"make_docs_tables.py: {e}", file=sys.stderr)
        return 1
    if check and stale:
        for s in stale:
            print(f"{s}: differs from what its JSON renders to; run scripts/make_docs_tables.py", file=sys.stderr)
        return 1
    if not check:
        for s in stale:
            print(f"rewrote {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
