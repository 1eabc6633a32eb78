"""Tables of the peer benchmark against llama.cpp (bench/llamacpp_bench.mjs), for scripts/make_docs_tables.py."""
from docs_table_format import num, table, x  # noqa: F401


_LLAMACPP_METHODS = (("llamacpp_ar", "llama.cpp autoregressive"),
                     ("llamacpp_prompt_lookup", "llama.cpp prompt lookup (InputLookupTokenPredictor)"),
                     ("lede_ar", "our autoregressive"), ("lede_static", "our best static"),
                     ("lede_lede", "our LEDE"))


def _frac(c, n, key):
    """A check's count of n prompts ("-" where the run did not make it)."""
    return "-" if c.get(key) is None else f"{c[key]}/{n}"


def _text_check(c, n):
    """Same greedy text as llama.cpp, ours in f32 / in the file's storage; the first-tokens counts and the run of
    both engines with attention in float32 (llama.cpp's defaults round it through float16, ours K/V through
    bfloat16) where recorded."""
    def f(key):
        return _frac(c, n, key)

    first = (f" (first {c['first_tokens']} tokens: {f('same_first_tokens_f32_compute')} / "
             f"{f('same_first_tokens_native')})" if c.get("first_tokens") else "")
    kv = (f"; both with float32 attention: {f('same_greedy_text_f32_attention')} (first {c['first_tokens']}: "
          f"{f('same_first_tokens_f32_attention')})" if c.get("same_greedy_text_f32_attention") is not None else "")
    return f"{f('same_greedy_text_f32_compute')} / {f('same_greedy_text_native')}{first}{kv}"


def _divergences(c):
    """Where our native text leaves llama.cpp's: how many prompts, and the least ratio, at that step, of
    llama.cpp's probability of our token to that of its own (near 1: a near tie)."""
    d = c.get("divergences")
    if d is None:
        return "-"
    if not d:
        return "none"
    least = min(e["ours_p_under_llamacpp"] / e["llamacpp_p"] for e in d)
    return f"{len(d)}; >= {least:.3f}"


def llamacpp_heldout_table(data, opts):
    """The held-out-prompts run (results with `methods`): one row per method."""
    rows, checks = [], []
    # A run without speculation (--static "" --policy "" --lookup ""): the text check goes in a column of the
    # speed table instead of a table of its own.
    speculative = any(r["checks"].get(k) is not None for r in data["results"]
                      for k in ("llamacpp_lookup_lossless", "lede_static_lossless", "lede_lede_lossless"))
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
            c, n = r["checks"], r["checks"]["prompts"]
            frac = lambda k: _frac(c, n, k)  # noqa: E731
            rows.append([r["format"], r["threads"], label,
                         f"{num(m['median_tok_s'])} ({num(m['min_tok_s'])}-{num(m['max_tok_s'])})",
                         f"{x(v['median'])} ({v['min']:.2f}-{v['max']:.2f})", gbs]
                        + ([] if speculative else
                           [_text_check(c, n)
                            if key == "lede_ar" else "-"]))
        ceiling, ar = r.get("speculation_ceiling"), r["methods"].get("lede_ar")
        if ceiling and ar:
            b, v = ceiling["best"], ar["vs_llamacpp_ar"]
            rows.append([r["format"], r["threads"],
                         f"ceiling of any speculation: our autoregressive x {b['speedup']:.2f} (every draft "
                         f"accepted, E={b['exit_layer']} K={b['draft_len']})",
                         num(ar["median_tok_s"] * b["speedup"]), x(v["median"] * b["speedup"]), "-"]
                        + ([] if speculative else ["-"]))
        checks.append([r["format"], r["threads"], num(r["bytes"] / 1e6, "{:.1f}"),
                       _text_check(c, n),
                       f"{frac('llamacpp_lookup_lossless')} / {frac('lede_static_lossless')} / {frac('lede_lede_lossless')}"]
                      + ([" / ".join(f"{v:.2f}" for v in ceiling["verify_over_step"][1::2])] if ceiling else []))
    ceilings = any(r.get("speculation_ceiling") for r in data["results"])
    s, roof = data["settings"], data.get("roofline") or {}
    reads = len(roof.get("measurements") or [])
    roof_text = (f"; read roofline {roof['used_gb_per_s']:.1f} GB/s (one core, `lede_engine_bench --roofline-only`"
                 + (f", the best of {reads} reads during the run" if reads else "") + ")"
                 if roof.get("used_gb_per_s") else "")
    return (f"Greedy, {s['tokens']} tokens on each of {len(s['eval_prompts'])} held-out prompts ({s['prompts']}); "
            f"tok/s = tokens / decode seconds of a pass over all of them, median (range) of {s['repeats']} "
            f"interleaved passes; \"vs llama.cpp\" is per pass against llama.cpp autoregressive in the same pass; "
            + (f"static swept over E:D {s['static_sweep']} on the tuning prompts; " if s.get("static_sweep") else "")
            + ("the ceiling row is our autoregressive tok/s times the best (K + 1) autoregressive steps over one "
               "round of K drafts at exit layer E and their verification, as `lede calibrate` times them on the "
               "same file and threads: what any speculation, static or learned, would reach if every draft were "
               "accepted; " if ceilings else "")
            + f"GB/s = weight bytes per token x tok/s "
            f"(autoregressive rows){roof_text}; both engines read the same GGUF file; peer: "
            f"{data['peer']['package']} {data['peer']['version']}.\n\n"
            + table(["format", "threads", "method", "tok/s", "vs llama.cpp autoregressive",
                     "GB/s (share of read roofline)"]
                    + ([] if speculative else ["same greedy text as llama.cpp (the file's weights in f32 / in its "
                                               "storage; both with float32 attention)"]), rows)
            + ("" if not speculative else "\n\n" + table(["format", "threads", "file MB",
                     "same greedy text as llama.cpp (ours on the file's weights in f32 / in the file's storage; both "
                     "with float32 attention)",
                     "lossless vs the engine's autoregressive text (llama.cpp lookup / our static / our LEDE)"]
                    + (["our verification of 2 / 4 / 6 positions, in autoregressive steps"] if ceilings else []),
                    checks)))


def llamacpp_prefill_table(data):
    """The prefill rows of a run with --prefill-tokens: seconds per engine, and ours over llama.cpp's."""
    rows = []
    for r in data["results"]:
        p = r.get("prefill")
        if not p:
            continue
        sec = lambda v: f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"  # noqa: E731
        rows.append([r["format"], r["threads"], f"{p['llamacpp_tokens']} / {p['lede_tokens']}", sec(p["llamacpp_s"]),
                     sec(p["lede_s"]), f"{num(p['llamacpp_tokens'] / p['llamacpp_s']['median'])} / "
                     f"{num(p['lede_tokens'] / p['lede_s']['median'])}",
                     f"{x(p['lede_over_llamacpp']['median'])} ({p['lede_over_llamacpp']['min']:.2f}-"
                     f"{p['lede_over_llamacpp']['max']:.2f})"])
    if not rows:
        return ""
    load = (data.get("machine") or {}).get("load_average_1m") or {}
    load_text = (f" The machine's 1-minute load average was {load['before']:.1f} before the run and "
                 f"{load['after']:.1f} after it (2 cores shared with other work)." if load else "")
    return ("\n\nPrefill of one prompt (the held-out prompts joined, cut at "
            f"{data['settings']['prefill_tokens']} tokens with BOS), once per pass in the same passes: llama.cpp's "
            "evaluation of the ids in one call on a fresh context, ours `lede generate`'s prefill seconds (after a "
            "warm-up generation in the same process); seconds median (range); \"ours / llama.cpp\" is per pass, "
            f"below 1 when ours is faster.{load_text}\n\n"
            + table(["format", "threads", "prompt tokens (llama.cpp / ours)", "llama.cpp s", "our s",
                     "tok/s (llama.cpp / ours)", "ours / llama.cpp"], rows))


def llamacpp_prefill(data, opts):
    """Only the prefill rows (a run whose decode rows are a by-product, e.g. random weights)."""
    return llamacpp_prefill_table(data).lstrip("\n")


def llamacpp_compact(data, opts):
    """A run without speculation, one row per file and thread count: decode tok/s of both engines, the text check
    and the prefill (--prefill-tokens). With `settings=no` the settings line is left out (a second run of the
    same settings rendered below the first)."""
    rows = []
    for r in data["results"]:
        ll, ours = r["methods"]["llamacpp_ar"], r["methods"]["lede_ar"]
        c, n = r["checks"], r["checks"]["prompts"]
        v = ours["vs_llamacpp_ar"]
        p = r.get("prefill") or {}
        q = p.get("lede_over_llamacpp") or {}
        rows.append([r["format"], r["threads"], num(r["bytes"] / 1e6, "{:.1f}"),
                     f"{num(ll['median_tok_s'])} ({num(ll['min_tok_s'])}-{num(ll['max_tok_s'])})",
                     f"{num(ours['median_tok_s'])} ({num(ours['min_tok_s'])}-{num(ours['max_tok_s'])})",
                     f"{x(v['median'])} ({v['min']:.2f}-{v['max']:.2f})",
                     _text_check(c, n), _divergences(c),
                     (f"{p['llamacpp_s']['median']:.2f} / {p['lede_s']['median']:.2f}" if p else "-"),
                     (f"{x(q['median'])} ({q['min']:.2f}-{q['max']:.2f})" if q else "-")])
    s = data["settings"]
    load = (data.get("machine") or {}).get("load_average_1m") or {}
    settings = (f"Greedy, {s['tokens']} tokens on each of {len(s['eval_prompts'])} held-out prompts ({s['prompts']}), "
                f"median (range) of {s['repeats']} interleaved passes, ratios per pass; prefill: one "
                f"{s.get('prefill_tokens')}-token prompt (the held-out prompts joined) per pass, llama.cpp's one "
                f"evaluation call on a fresh context against `lede generate`'s prefill seconds after a warm-up; "
                f"peer: {data['peer']['package']} {data['peer']['version']}.")
    for row in rows:
        row.append(f"{load['before']:.1f} / {load['after']:.1f}" if load else "-")
    return (settings + "\n\n" if opts.get("settings", "yes") != "no" else "") + table(
        ["format", "threads", "file MB", "llama.cpp tok/s", "our tok/s", "ours / llama.cpp",
         "same greedy text as llama.cpp (ours in f32 / native; both with float32 attention)",
         "native text differs: prompts; least p(our token) / p(llama.cpp's) under llama.cpp there",
         "prefill s (llama.cpp / ours)",
         "prefill, ours / llama.cpp", "load average (before / after the run)"], rows)


def llamacpp_table(data, opts):
    if data["results"] and "methods" in data["results"][0]:
        return llamacpp_heldout_table(data, opts) + llamacpp_prefill_table(data)
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
