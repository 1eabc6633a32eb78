#!/usr/bin/env python3
"""Writes models/lede-tiny/README.md (the model card) from the JSON the tools wrote:
report.json (lede-pretrain), eval_exits.json (lede-eval-exits), bench.json (lede-bench bench),
data_manifest.json (scripts/build_corpus.py) and policy/*/policy.json (lede-train).
usage: make_model_card.py MODEL_DIR
"""
import glob
import json
import os
import sys


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main():
    d = sys.argv[1]
    rep, ev, bench, man = (load(os.path.join(d, n)) for n in
                           ("report.json", "eval_exits.json", "bench.json", "data_manifest.json"))
    cfg = load(os.path.join(d, "config.json"))
    L = cfg["num_hidden_layers"]
    out = []
    w = out.append
    rep1 = load(os.path.join(d, "report_stage1.json"))  # stage 1, when the model was trained in two
    stages = [r for r in (rep1, rep) if r]
    hours = sum(r["training_seconds"] for r in stages) / 3600
    w("# lede-tiny: a LayerSkip-style demo model for LEDE\n")
    w("A small Llama-architecture model trained by this project's own trainer (`lede-pretrain`) with the "
      "LayerSkip recipe (layer dropout rising with depth, early-exit loss through the shared final norm + LM "
      "head), so that its early layers agree with its last layer often enough for self-speculative decoding. "
      f"It is what `scripts/demo` serves. It is tiny and trained for {hours:.1f} h on 2 CPU cores: it writes "
      "simple TinyStories-style English and Python-looking code, nothing more.\n")
    w("## Architecture\n")
    w(f"| layers L | d | heads (kv) | FFN | vocab | context | parameters |\n|---|---|---|---|---|---|---|\n"
      f"| {L} | {cfg['hidden_size']} | {cfg['num_attention_heads']} ({cfg['num_key_value_heads']}) | "
      f"{cfg['intermediate_size']} | {cfg['vocab_size']} (SentencePiece BPE, byte fallback) | "
      f"{cfg['max_position_embeddings']} | {rep['parameters'] / 1e6:.2f}M |\n")
    w("Files: `config.json`, `model.safetensors` (F32), `tokenizer.model` (Hugging Face layout).\n")
    w("## Data\n")
    w("Built by `scripts/build_corpus.py` from `testdata/corpus` (TinyStories head and validation part, "
      "Grimms' fairy tales and Alice in Wonderland with the Project Gutenberg header/footer stripped, "
      "tinyshakespeare), the Python 3.11 standard library sources Debian installs (a deterministic subset), and "
      "synthetic stories sampled from `testdata/models/stories260K` with this engine "
      "(`scripts/sample_synthetic_stories.sh`, temperature 0.7, top-p 0.95). Every 20th document of each domain "
      "is held out; the synthetic stories added for stage 2 went into the training split only, so both stages "
      "share one held-out split. `data_manifest.json` lists every source file with its size and sha256.\n")
    head = "| domain | " + " | ".join(f"stage {i + 1} weight | stage {i + 1} train tokens" if len(stages) > 1
                                      else "mixture weight | train tokens" for i in range(len(stages)))
    w(head + " | train docs | held-out docs |")
    w("|---|" + "---|---|" * len(stages) + "---|---|")
    for dom, info in man["domains"].items():
        cells = []
        for r in stages:
            cells += [f"{r['mixture'].get(dom, 0):.2f}", f"{r['train_tokens'].get(dom, 0)}"]
        w(f"| {dom} | " + " | ".join(cells) + f" | {info['train']['documents']} | {info['val']['documents']} |")
    w("")
    w("## Recipe\n")
    for i, r in enumerate(stages):
        o = r["options"]
        always = o.get("exit_always", 0)
        exits = (f"on the layers l with (l + step) mod {o['curriculum_period']} = 0 (rotational curriculum)"
                 + (f" and on layers 1-{always} at every step" if always else ""))
        distill = o.get("exit_distill", 0)
        if distill:
            exits += f", {distill:.2f} of it self-distillation toward the last layer"
        start = (f"Continued from stage 1's weights with a fresh AdamW state and schedule: "
                 if o.get("init_from") else "From a random initialization: ")
        label = f"**Stage {i + 1}.** " if len(stages) > 1 else ""
        w(f"{label}{start}AdamW (betas 0.9/0.95, weight decay {o['weight_decay']} on matrices), peak lr "
          f"{o['lr']}, {o['warmup_steps']} warm-up steps then cosine to {o['min_lr_ratio']}x, gradient clipping "
          f"at {o['grad_clip']}; batch {o['batch_size']} x {o['seq_len']} tokens; {r['steps']} steps "
          f"({r['tokens_seen'] / 1e6:.1f}M tokens seen); layer dropout 0 at the first layer rising linearly to "
          f"{o['layer_dropout_max']} at the last; early-exit loss weight {o['exit_scale']} {exits}; seed "
          f"{o['seed']}; {o['threads']} thread(s); {r['training_seconds'] / 3600:.2f} h on this 2-core "
          f"machine.\n")
    w("Reproduce: `scripts/build && scripts/train_lede_tiny.sh 1200 1 2100 2` (both stages; resumable: rerun "
      "after an interruption).\n")
    notes = os.path.join(d, "training_notes.md")
    if os.path.exists(notes):
        w(open(notes).read().strip() + "\n")
    if rep1:
        w("## What stage 2 changed (held-out stories)\n")
        w("| layer | stage 1 ppl | stage 1 agree | final ppl | final agree |\n|---|---|---|---|---|")
        a, b = rep1["held_out"]["stories"], rep["held_out"]["stories"]
        for l in range(L):
            w(f"| {l + 1} | {a['perplexity'][l]:.1f} | {a['top1_agreement_with_last'][l]:.3f} | "
              f"{b['perplexity'][l]:.1f} | {b['top1_agreement_with_last'][l]:.3f} |")
        w("")
    src = load(os.path.join(d, "eval_sources.json"))  # scripts/eval_by_source.sh
    if src and "stage 1" in src:
        w("### Held-out stories by source (`scripts/eval_by_source.sh`)\n")
        w("Stage 2 trains mostly on stories sampled from a 260K-parameter model, whose text is simpler than real "
          "TinyStories. Whether that costs anything on real text shows on the held-out real TinyStories: perplexity "
          "of the last layer, and top-1 agreement of layers 2 and 4 with it, before and after stage 2.\n")
        w("| source | tokens | stage 1 ppl | final ppl | stage 1 agree@2 | final agree@2 | stage 1 agree@4 | "
          "final agree@4 |\n|---|---|---|---|---|---|---|---|")
        for dom in src["final"]:
            a, b = src["stage 1"][dom], src["final"][dom]
            w(f"| {dom} | {b['tokens']} | {a['perplexity'][-1]:.2f} | {b['perplexity'][-1]:.2f} | "
              f"{a['top1_agreement_with_last'][1]:.3f} | {b['top1_agreement_with_last'][1]:.3f} | "
              f"{a['top1_agreement_with_last'][3]:.3f} | {b['top1_agreement_with_last'][3]:.3f} |")
        w("")
    w("## Early exits on held-out text\n")
    w("Per layer: perplexity of the exit at that layer, and top-1 agreement with the last layer, on the "
      "held-out documents of each domain as `lede-pretrain` evaluated them at the end of training "
      "(`report.json`, up to 16384 tokens per domain; `eval_exits.json` holds `lede-eval-exits`' own "
      "per-layer table on up to 32768 held-out tokens of stories and code).\n")
    doms = list(rep["held_out"].keys())
    w("| layer | " + " | ".join(f"{x} ppl | {x} agree" for x in doms) + " |")
    w("|---|" + "---|---|" * len(doms))
    for l in range(L):
        cells = []
        for x in doms:
            h = rep["held_out"][x]
            cells += [f"{h['perplexity'][l]:.1f}", f"{h['top1_agreement_with_last'][l]:.3f}"]
        w(f"| {l + 1} | " + " | ".join(cells) + " |")
    w("")
    if ev:
        w("## Static self-speculation (E x D) on held-out prompts\n")
        cal = ev["calibration"]
        w(f"Greedy, prompts cut from held-out documents. Cost models (docs/design.md §1): *accelerator* (verification "
          f"costs one step; the LM head is h = {ev['head_layer_equivalents']:.2f} layer-equivalents) and "
          f"*measured* (this CPU: full step {cal['step_us']:.0f} us; one block {cal['block_us'][0]:.0f} us for 1 "
          f"position, {cal['block_us'][3]:.0f} us for 4, {cal['block_us'][15]:.0f} us for 16"
          + (f"; rounds priced from real rounds timed in the decoding loop, in autoregressive rounds of "
             f"{cal['ar_step_us']:.0f} us: K drafts at E=2 and their verification take "
             + ", ".join(f"{x / cal['ar_step_us']:.2f}" for x in cal['round_us'][1][:6]) + " for K = 1..6"
             if cal.get('round_us') else "") + ").\n")
        for dom, r in ev["domains"].items():
            g = r["static_grid"]
            w(f"### {dom} ({g['prompts']} prompts x {g['new_tokens']} tokens; AR {g['ar']['tokens_per_s']:.0f} "
              f"tokens/s)\n")
            w("| E | D | acceptance | tokens/round | tokens/s | measured | predicted accel. | predicted measured |")
            w("|---|---|---|---|---|---|---|---|")
            for row in g["static"]:
                w(f"| {row['exit_layer']} | {row['draft_len']} | {row['acceptance_rate']:.3f} | "
                  f"{row['tokens_per_round']:.2f} | {row['tokens_per_s']:.0f} | {row['measured_speedup']:.2f}x | "
                  f"{row['predicted_speedup_accelerator']:.2f}x | {row['predicted_speedup_measured']:.2f}x |")
            b = g["best_accelerator"]
            w(f"\nBest under the accelerator model: E={b['exit_layer']}, D={b['draft_len']}: "
              f"{b['predicted_speedup_accelerator']:.2f}x predicted, {b['measured_speedup']:.2f}x measured "
              f"wall-clock on this CPU.\n")
    if bench:
        w("## LEDE against its baselines (`lede-bench bench`, evaluation split)\n")
        w("Each prompt file is split in halves: every baseline (static over every exit layer 1..L-1 and draft "
          "length 1..8; thresholds; the calibrated stopping rule; DEL-style; AdaEDL) was tuned by exact replay on "
          "the tuning half, per cost model, and LEDE's policies were trained only on requests of the tuning half "
          "(`story-*` policies on story requests only). Every number below is from the evaluation half, run "
          "through the engine. *measured* is wall-clock tokens/s over the autoregressive run of the same process; "
          "*pred.* columns apply the cost models to the rounds each method actually ran.\n")
        for name, s in bench["sets"].items():
            w(f"### {name} ({s['eval_prompts']} prompts; AR {s['ar_tokens_per_s']:.0f} tokens/s)\n")
            w("| method | config | tokens/s | measured | pred. accel. | pred. measured | acceptance | "
              "tokens/round | mean exit | mean D | exact match |")
            w("|---|---|---|---|---|---|---|---|---|---|---|")
            for r in s["rows"]:
                w(f"| {r['method']} | {r['config']} | {r['tokens_per_s']:.0f} | {r['measured_speedup']:.2f}x | "
                  f"{r['predicted_speedup_accelerator']:.2f}x | {r['predicted_speedup_measured']:.2f}x | "
                  f"{r['acceptance_rate']:.3f} | {r['tokens_per_round']:.2f} | {r['mean_exit_layer']:.2f} | "
                  f"{r['mean_draft_len']:.2f} | {r['exact_match_rate']:.2f} |")
            for key, label in (("calibrated_ceiling", "calibrated (in-sample)"),
                               ("belief_ceiling_tuning_fit", "belief (tuning fit)"),
                               ("belief_ceiling_in_sample", "belief (in-sample)")):
                c = s.get(key)
                if c:
                    w(f"| ceiling: {label} | | | | {c['accelerator']:.2f}x | {c['measured']:.2f}x | | | | | |")
            o = s["hindsight_oracle"]
            w(f"| ceiling: hindsight oracle | | | | {o['accelerator']:.2f}x | {o['measured']:.2f}x | | | | | |\n")
    pols = sorted(glob.glob(os.path.join(d, "policy", "*", "policy.json")))
    if pols:
        w("## Shipped policies (`policy/`)\n")
        w("| version | reward cost model | rho | candidate layers | D_max | probes (phase 1 / lookahead) | "
          "transitions | selection speed-up (replay) |")
        w("|---|---|---|---|---|---|---|---|")
        for p in pols:
            m = load(p)
            opts = m.get("training_options", {})
            rho = opts.get("rho")
            sel = m["offline_metrics"].get("selection_speedup")
            w(f"| {m['version']} | {m['reward']['cost_model']} | {rho if rho is None else f'{rho:.3f}'} | "
              f"{m['candidate_layers']} | {m['max_draft_len']} | "
              f"{m.get('probe_candidates', True)} / {m.get('lookahead_probe', True)} | "
              f"{m['training_data']['n_transitions']} | {sel if sel is None else f'{sel:.3f}x'} |")
        serving = open(os.path.join(d, "policy", "SERVING")).read().strip() if os.path.exists(
            os.path.join(d, "policy", "SERVING")) else "?"
        w(f"\n`policy/SERVING` = `{serving}` (set by scripts/train_policies.sh to the LEDE policy "
          f"measured fastest in wall-clock on this CPU overall; the tables above have each set); on CUDA `lede generate "
          f"--mode lede` picks an accelerator-cost policy.\n")
    w("## Licence\n")
    w("Trained on CDLA-Sharing-1.0 (TinyStories), public-domain (Project Gutenberg, Shakespeare), PSF-licensed "
      "(Python standard library) and MIT (stories260K samples) data; see "
      "[testdata/SOURCES.md](../../testdata/SOURCES.md).\n")
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", os.path.join(d, "README.md"))


if __name__ == "__main__":
    main()
