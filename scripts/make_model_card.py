#!/usr/bin/env python3
"""Writes models/lede-tiny/README.md (the model card) from the JSON the tools wrote:
report.json and report_stage1.json (lede-pretrain), data_manifest.json (scripts/build_corpus.py)
and policy/*/policy.json (lede-train) in MODEL_DIR, and the benchmark results under
bench/results/<model>-{eval-exits,eval-sources,weight-formats,bench}.json (bench/record.py).
Every measured table is a generated block of scripts/make_docs_tables.py, which names its JSON
(and which that script and tests/docs/docs_test.py keep current).
usage: make_model_card.py MODEL_DIR
"""
import glob
import json
import os
import sys

import make_docs_tables


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main():
    d = sys.argv[1]
    doc = os.path.relpath(os.path.join(os.path.abspath(d), "README.md"), make_docs_tables.ROOT)
    model_rel = os.path.dirname(doc)
    results = os.path.join("bench", "results", os.path.basename(model_rel))
    rep, man = (load(os.path.join(d, n)) for n in ("report.json", "data_manifest.json"))
    ev = load(os.path.join(make_docs_tables.ROOT, results + "-eval-exits.json"))
    bench = load(os.path.join(make_docs_tables.ROOT, results + "-bench.json"))

    def block(spec):
        return make_docs_tables.block(doc, spec)
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
        w(block(f"{model_rel}/report.json stage2") + "\n")
    src = load(os.path.join(make_docs_tables.ROOT, results + "-eval-sources.json"))  # scripts/eval_by_source.sh
    if src and "stage 1" in src:
        w("### Held-out stories by source (`scripts/eval_by_source.sh`)\n")
        w("Stage 2 trains mostly on stories sampled from a 260K-parameter model, whose text is simpler than real "
          "TinyStories. Whether that costs anything on real text shows on the held-out real TinyStories: perplexity "
          "of the last layer, and top-1 agreement of layers 2 and 4 with it, before and after stage 2.\n")
        w(block(results + "-eval-sources.json") + "\n")
    w("## Early exits on held-out text\n")
    w("Per layer: perplexity of the exit at that layer, and top-1 agreement with the last layer, on the "
      "held-out documents of each domain as `lede-pretrain` evaluated them at the end of training "
      "(`report.json`, up to 16384 tokens per domain; the `lede-eval-exits` result below also holds its own "
      "per-layer table on up to 32768 held-out tokens of stories and code).\n")
    w(block(f"{model_rel}/report.json exits") + "\n")
    if os.path.exists(os.path.join(make_docs_tables.ROOT, results + "-weight-formats.json")):
        w("## Weight formats (`--weights bf16|q8_0`) on `tinystories_val_a.txt`\n")
        w("The fused CPU path can hold the matrices in bf16 or llama.cpp's Q8_0\n"
          "([docs/models.md](../../docs/models.md#weight-formats---weights-autof32bf16q8_0)).\n"
          "Their effect on the last layer's perplexity and on the layer-2 exit's agreement\n"
          "with it:\n")
        w(block(results + "-weight-formats.json") + "\n")
    if os.path.exists(os.path.join(make_docs_tables.ROOT, results + "-perplexity.json")):
        w("## Every weight format, 4-bit included, on held-out text (`lede-perplexity`)\n")
        w("Perplexity of the last layer at f32, bf16, q8_0 and llama.cpp's Q4_0 and Q4_K_M tensor mixes "
          "(`--weights q4_0|q4_k_m`, quantized at load; and the Q4_K_M GGUF file `lede export` writes, which is "
          "what a user downloads), for lede-tiny and for lede-tiny widened 4x (`lede widen --factor 4`: d 768, "
          "78.7M parameters, every row a multiple of 256, so Q4_K and Q6_K blocks are used as llama.cpp uses them; "
          "at d 192 most rows fall back to Q5_0 / Q8_0). The text is lede-tiny's held-out split, rebuilt by "
          "`bench/heldout_text.py` from testdata/corpus with `scripts/build_corpus.py`'s own rules: the tales and "
          "drama files are byte for byte the held-out files of `data_manifest.json` (sha256 checked), and the "
          "stories file holds the held-out real TinyStories documents (the synthetic held-out stories' source is "
          "not in the repository). The window is 256 positions, the length lede-tiny was trained on (its config "
          "allows 512, but positions past 256 were never trained, and a 512-position window scores far worse "
          "on the same text). The perplexities here are higher than those of the weight-format table above, whose file `tinystories_val_a.txt` is mostly "
          "training documents (every 20th story of the domain is held out). The GGUF file holds llama.cpp's whole "
          "Q4_K_M mix, the token embedding in Q4_K included (`--weights q4_k_m` at load keeps the embedding, a row "
          "lookup, in f32).\n")
        w(block(results + "-perplexity.json") + "\n")
    if ev:
        w("## Static self-speculation (E x D) on held-out prompts\n")
        w(block(results + "-eval-exits.json") + "\n")
    if bench:
        w("## LEDE against its baselines (`lede-bench bench`, evaluation split)\n")
        w("Each prompt file is split in halves: every baseline (static over every exit layer 1..L-1 and draft "
          "length 1..8; thresholds; the calibrated stopping rule; DEL-style; AdaEDL) was tuned by exact replay on "
          "the tuning half, per cost model, and LEDE's policies were trained only on requests of the tuning half "
          "(`story-*` policies on story requests only). Every number below is from the evaluation half, run "
          "through the engine. *measured* is wall-clock tokens/s over the autoregressive run of the same process; "
          "*pred.* columns apply the cost models to the rounds each method actually ran.\n")
        w(block(results + "-bench.json full") + "\n")
    pols = sorted(glob.glob(os.path.join(d, "policy", "*", "policy.json")))
    if pols:
        w("## Shipped policies (`policy/`)\n")
        w(block(f"{model_rel}/policy") + "\n")
        serving = open(os.path.join(d, "policy", "SERVING")).read().strip() if os.path.exists(
            os.path.join(d, "policy", "SERVING")) else "?"
        w(f"`policy/SERVING` = `{serving}` (set by scripts/train_policies.sh to the LEDE policy "
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
