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
reproduces the JSON (COMMANDS, scripts/docs_table_commands.py). The block holds a line naming that file
and its provenance (the command, commit, date and machine that bench/record.py
stored in it), then the table. A table renders only from a JSON that exists
and was recorded at a commit without local changes (no `-dirty`): anything
else is an error naming the file. How results are recorded and retired:
bench/results/README.md.
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_GLOBS = ("README.md", "docs/*.md", "models/lede-tiny/README.md")
MARKER = re.compile(r"<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- /table -->", re.S)
PROVENANCE_KEYS = ("command", "commit", "date", "machine")

# Sibling modules (this script's folder is on sys.path): the reproducing
# commands, the shared cell formats and the llama.cpp tables.
from docs_table_commands import COMMANDS, DocsError  # noqa: E402
from docs_table_format import num, table, x  # noqa: E402
from docs_tables_llamacpp import llamacpp_compact, llamacpp_prefill, llamacpp_table  # noqa: E402


def load(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


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


def cost_profiles_table(data, opts):
    """The cost-conditioned policy against the shipped one and the baselines in wall-clock, one row per
    prompt set: static and the calibrated rule tuned on the tuning half, the faster of their tunings under the
    run's calibration and under the accelerator model."""
    base, cond = opts.get("base", "accelerator-v1"), opts.get("policy", "cost-v1")
    # More policies, one column each; "V@calibration" is policy V shown the calibration's costs instead of the
    # run's own (lede-bench --policy-costs served,calibration: its row "lede V (calibration costs)").
    also = [v for v in opts.get("also", "").split(",") if v]
    row_name = (lambda v: "lede " + (f"{v.split('@')[0]} ({v.split('@')[1]} costs)" if "@" in v else v))
    header = (lambda v: f"{v.split('@')[0]}, {v.split('@')[1]} costs" if "@" in v else v)
    out = []
    for name, s in data["sets"].items():
        rows = s["rows"]
        key = "measured_speedup"
        # The faster of each baseline's tunings (under the calibration and under the accelerator model): a
        # calibration timed apart from the run can misprice it, and the baselines get their whole space.
        static = _best(_tuned(rows, "static"), key)
        rule = _best(_tuned(rows, "calibrated"), key)
        shipped = next((r for r in rows if r["method"] == "lede " + base), None)
        lede = next((r for r in rows if r["method"] == "lede " + cond), None)
        ratio = (lambda a, b: x(a[key] / b[key], 3) if a and b else "-")
        # How well the run's measured cost model predicts each method, and how far above the best rule any
        # policy acting on the acceptance beliefs could get (both predicted, trainer/ceilings.h).
        # The calibration's and the run's own step costs (as the deployment meters them, "served").
        def largest_error(pred):
            errors = [abs(r[key] / r[pred] - 1) for r in rows if r.get(pred, 0) > 0]
            return f"{100 * max(errors):.1f}%" if errors else "-"
        # Priced by the run's own steps where the run recorded them (the better prediction), else by the
        # calibration: the belief-optimal ceiling over the best static row and over the rule's own ceiling.
        belief, rule_best = s.get("belief_ceiling_in_sample", {}), s.get("calibrated_ceiling", {})
        pricing = "served" if belief.get("served") and rule_best.get("served") else "measured"
        pred = "predicted_speedup_" + pricing
        headroom = (f"{x(belief[pricing] / static[pred], 3)} / {x(belief[pricing] / rule_best[pricing], 3)}"
                    if belief.get(pricing) and rule_best.get(pricing) and static and static.get(pred) else "-")
        headroom += ("" if headroom == "-" else " (calibration)" if pricing == "measured" else " (own steps)")
        label = name if not s.get("temperature") else f"{name}, T={s['temperature']:g}, {s.get('seeds', 1)} seeds"
        out.append([label, f"{num(s['ar_tokens_per_s'])} tok/s",
                    f"{x(static[key])} ({static['config']})" if static else "-",
                    f"{x(rule[key])} ({rule['config']})" if rule else "-",
                    x(shipped[key]) if shipped else "-",
                    *[x(r[key]) if r else "-" for r in
                      (next((r for r in rows if r["method"] == row_name(v)), None) for v in also)],
                    f"{x(lede[key])} (mean D {lede['mean_draft_len']:.2f})" if lede else "-",
                    ratio(lede, static), ratio(lede, rule), ratio(lede, shipped), headroom,
                    f"{largest_error('predicted_speedup_measured')} / {largest_error('predicted_speedup_served')}"])
    return table(["set", "autoregressive", "best static", "calibrated rule", base, *map(header, also), cond,
                  f"{cond} / static", f"{cond} / rule", f"{cond} / {base}",
                  "belief ceiling / best static, / rule ceiling (predicted)",
                  "largest prediction error: calibration / the run's own steps"], out)


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
    checks = " ".join(
        f"{c['requests']} {c['method']} requests at once on {data['slots']} slots (max batch "
        f"{c['max_batch']}): {c['completed']} completed, {c['equal_to_solo']} equal to their solo runs"
        + (f" ({c['requests'] - c['solo_completed']} of the solo runs failed"
           + (f": {', '.join(sorted(set(c['solo_failed'].values())))}" if c.get("solo_failed") else "") + ")"
           if c.get("solo_completed", c["requests"]) < c["requests"] else "") + "."
        for c in data.get("solo_checks", []))
    checks = "\n\n" + checks if checks else ""  # one paragraph for every check
    head = ["deployment", "max batch"] + (["batch threads x workers"] if plans else [])
    return (f"{data['prompts']} prompts, {data['new_tokens']} new tokens, {data['slots']} KV slots; times in ms "
            "(mean / p99); sessions per verifier step.\n\n"
            + table(head + ["method", "clients", "done", "req/s", "output tok/s", "TTFT",
                     "TPOT", "ITL", "acceptance", "sessions/step"], body) + checks)


def services_table(data, opts):
    body = [[r["deployment"], r["method"], str(r.get("threads", 1)), num(r["decode_tokens_per_s"], "{:.1f}"),
             num(r["ratio_to_in_process"], "{:.0%}") if r["ratio_to_in_process"] is not None else "-",
             num(r["client_tokens_per_s"], "{:.1f}"), num(r["acceptance_rate"], "{:.3f}")] for r in data["rows"]]
    def same(key, what):
        value = data.get(key)
        return "" if value is None else f" Same tokens {what}: {'yes' if value else 'NO'}."
    model = f"{data['model']} {data['weights'] or ''}, " if data.get("model") else ""
    return (f"{model}{data['prompts']} prompts x {data['new_tokens']} new tokens, greedy; 'vs in-process' compares "
            f"the same method at the same threads.{same('same_tokens_split_colocated', 'split and co-located')}"
            f"{same('same_tokens_remote', 'with remote decisions')}\n\n"
            + table(["deployment", "method", "threads", "decode tok/s", "vs in-process", "client tok/s", "acceptance"],
                    body))


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


def _perplexity_model(row):
    """A row's model label: its name, hidden size and, for a GGUF file, which export wrote it."""
    path = row["model"]
    name = os.path.basename(path.rstrip("/"))
    if path.endswith(".gguf"):
        kind = re.search(r"(q4_k_m|q4_0|q8_0|bf16|f16|f32)", name)
        return f"`{name}` (d {row['dim']}; `lede export --weights {kind.group(1) if kind else '?'}`)"
    return f"{name} (d {row['dim']})"


def perplexity_table(data, opts):
    """lede-perplexity (bench/perplexity_main.cc): one row per (model, weights), one column pair per held-out file."""
    domains = list(dict.fromkeys(r["data"] for r in data["rows"]))  # in the order the runs measured them
    cells, base = {}, {}
    for r in data["rows"]:
        key = (_perplexity_model(r), r["weights"] if not r["model"].endswith(".gguf") else "GGUF file's blocks")
        cells.setdefault(key, {"mb": r["weight_bytes"] / 1e6})[r["data"]] = r
        if r["weights"] == "f32":
            base[(r["dim"], r["n_layers"], r["data"])] = r["perplexity"]
    rows = []
    for (model, weights), c in cells.items():
        row = [model, weights, num(c["mb"], "{:.1f}")]
        for d in domains:
            r = c.get(d)
            if r is None:
                row += ["-", "-"]
                continue
            ref = base.get((r["dim"], r["n_layers"], d))
            row += [f"{r['perplexity']:.3f}", "-" if ref is None else f"{100 * (r['perplexity'] / ref - 1):+.2f}%"]
        rows.append(row)
    tokens = {}
    for r in data["rows"]:
        tokens[r["data"]] = r["tokens"]
    header = ["model", "weights", "matrices MB"]
    for d in domains:
        header += [f"{d} perplexity ({tokens[d]:,} tokens)", "vs f32"]
    window = data["window"] or "the model's context"
    stride = data["stride"] or "window / 2"
    return (f"Teacher-forced, last layer, through the fused kernels at each format (the serving path: KV cache, "
            f"activation rounding included); sliding window of {window} positions moved {stride} tokens at a time, "
            f"every token after the first scored once; held-out files: "
            + ", ".join(f"{d} `{data['data'][d]}`" for d in domains)
            + ". \"vs f32\" is against the same model's f32 row (the widened model computes lede-tiny's function, "
              "so its f32 perplexity is lede-tiny's).\n\n"
            + table(header, rows))


def weight_formats_table(data, opts):
    f = data["formats"]
    base = f["f32"]
    rows = []
    for name, r in f.items():
        ppl, agree = r["perplexity"], r["top1_agreement_with_last"]
        rows.append([name, f"{ppl[-1]:.3f}", f"{100 * (ppl[-1] / base['perplexity'][-1] - 1):+.2f}%",
                     f"{100 * agree[1]:.1f}%", f"{100 * (agree[1] - base['top1_agreement_with_last'][1]):+.1f}",
                     f"{ppl[1]:.2f}"])
    return (f"{data['model']} on {base['tokens']} tokens of `{data['data']}` (mostly documents lede-tiny trained "
            f"on: every 20th story of its stories domain is held out; the held-out-only measurement is "
            f"`lede-perplexity`'s, in the model card).\n\n"
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
             f"{report.get('heldout_requests', '?')} held-out requests). Then {h['rounds']} deployments, each timing "
             f"{h['prompts']} held-out prompts ({data['prompts']['heldout']}), {h['new_tokens']} tokens, greedy, "
             f"one stream: per prompt, autoregressive decoding, then the default method under each policy in turn "
             f"(SERVING switched in place, the order rotating), so a deployment's own speed cancels in the ratios.",
             "", ""]
    policies = [v for v in (tr["cold_start_version"], data.get("published_version"), data.get("shipped_version")) if v]
    rows = []
    for r in data["served"]:
        rows.append([r["round"] + 1, "autoregressive", f"{r['tok_s']['autoregressive']:.1f}", "1.000x", "-"])
        rows += [[r["round"] + 1, f"`{v}`", f"{r['tok_s'][v]:.1f}", f"{r['speedup'][v]:.3f}x", r["lossless"][v]]
                 for v in policies]
    t = table(["deployment", "method", "tok/s", "speed-up", "same text as autoregressive"], rows)
    ratio_rows = [[pair.replace(" / ", " over "), f"**{v['median']:.3f}x** [{v['min']:.3f}, {v['max']:.3f}]"]
                  for pair, v in data.get("ratios", {}).items()]
    t2 = table(["policies", "tok/s ratio in the same deployment, median [range] over deployments"], ratio_rows)
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


def kv_pool_detail(kv):
    """The pool's shape: blocks shared by the slots (paged), or slots of a
    fixed capacity (results written before the pool was paged)."""
    if "n_blocks" not in kv:
        return f"{kv.get('slots')} slots of {num(kv.get('capacity_tokens'))} tokens"
    dtype = f" of {kv['kv_dtype']} K/V" if "kv_dtype" in kv else ""
    return (f"{num(kv['n_blocks'])} blocks of {kv['block_tokens']} tokens{dtype} "
            f"({num(kv['n_blocks'] * kv['block_tokens'])} tokens) shared by {kv.get('slots')} slots; "
            f"one sequence up to {num(kv.get('capacity_tokens'))} tokens")


def big_model_serving_table(data, opts):
    st, kv = data["start"], data["kv"]
    gib = lambda v: f"{v / 2**30:.2f} GiB" if isinstance(v, (int, float)) else "?"
    rows = [["start (scripts/run --detach, cold start included)", f"{st['start_s']:.0f} s",
             f"cold start {st['cold_start_s']:.0f} s, of which loading the model {st['cold_start_load_s']:.0f} s "
             f"({st.get('cold_start_sizing') or '?'})"],
            ["KV budget / pool / segment", f"{gib(kv.get('budget_bytes'))} / {gib(kv.get('pool_bytes'))} / "
             f"{gib(kv.get('segment_bytes'))}", kv_pool_detail(kv)]]
    rss = data.get("peak_rss_bytes", {})
    if rss:
        rows.append(["peak RSS", ", ".join(f"{k} {gib(v)}" for k, v in sorted(rss.items())),
                     "the verifier's includes the pool segment it maps"])
    ob = data.get("over_budget")
    if ob:
        if "n_blocks" not in kv:
            what = "2 slots"
        elif ob["prompt_tokens_about"] > kv.get("window_tokens", 0):
            what = "past the window, which one sequence may fill"
        else:
            what = "past one sequence's capacity"
        rows.append([f"prompt of about {num(ob['prompt_tokens_about'])} tokens ({what})", f"HTTP {ob['status']}",
                     f"{ob.get('message') or ''}; next request HTTP {ob['next_request_status']}"])
    pf = data.get("prefill")
    if pf:
        pairs = "; ".join(f"{p['services_s']:.1f} s vs {p['cli_prefill_s']:.1f} s" for p in pf["pairs"])
        rows.append([f"prefill of {num(pf['prompt_tokens'])} tokens, services vs `lede generate --threads "
                     f"{data['threads']}`", f"ratio {pf['median_ratio']:.2f} (median)", pairs])
    cc = data.get("concurrent")
    if cc:
        s = data["settings"]
        rows.append([f"{s['concurrency']} concurrent requests of {num(s['prompt_tokens'])} prompt tokens, "
                     f"{s['new_tokens']} new", f"{cc['completed']} of {s['concurrency']} complete",
                     f"{cc['wall_s']:.0f} s in all"])
    return table(["step", "result", "detail"], rows)


# kind -> {view -> renderer(data, opts)}; the first view is the default.
RENDERERS = {
    "lede-bench bench": {"full": bench_full, "summary": bench_summary, "cost-profiles": cost_profiles_table},
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
    "llamacpp_bench": {"table": llamacpp_table, "compact": llamacpp_compact, "prefill": llamacpp_prefill},
    "weight_formats_quality": {"table": weight_formats_table},
    "perplexity": {"table": perplexity_table},
    "retrain acceptance": {"table": retrain_acceptance_table},
    "retrain scale": {"table": retrain_scale_table},
    "retrain widened": {"table": retrain_widened_table},
    "batching ceiling": {"table": batching_ceiling_table},
    "big_model_serving": {"table": big_model_serving_table},
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
        raise DocsError(f"{doc}: table {path}: not a known result (scripts/docs_table_commands.py COMMANDS)")
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
