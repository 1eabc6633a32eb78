#!/usr/bin/env python3
"""Writes the extra prompts LEDE's exit policies train on (never evaluation data).

The evaluation prompts of models/lede-tiny (prompts/story.jsonl, prompts/code.jsonl) were cut
from held-out documents, some of which sit in the same TinyStories files as training stories.
So the story prompts here are story openings from testdata/corpus/tinystories_*.txt whose
text shares no 40-character opening with any evaluation prompt (and vice versa; nor do the five
paragraphs on either side of one that does). The code prompts are cut as the evaluation's are
(scripts/make_prompt_sets.py: a `def`/`class` line and the three after it) from Python standard
library modules that the model's data_manifest.json does not list, so the model neither trained
on them nor were evaluation prompts cut from them: the evaluation's domain (standard-library
code) without its documents. At most three per module, spread through it. (HumanEval, the code
source before, is another domain: the calibrated rule with lookahead tuned on it exits at layer 2
where the evaluation's tuning half wants layer 5, and policies trained on it inherited that.)
Deterministic: the modules are read from the standard library the manifest lists (Debian 12:
/usr/lib/python3.11).

usage: scripts/make_policy_training_prompts.py OUT_DIR [N_STORIES]
"""
import json
import os
import sys

from make_prompt_sets import function_openings

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "corpus")
MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "lede-tiny")


def stdlib_code_prompts(n, overlaps):
    """n prompts cut from standard-library modules outside the model's data manifest."""
    with open(os.path.join(MODEL, "data_manifest.json"), encoding="utf-8") as f:
        files = [s["file"] for s in json.load(f)["sources"]]
    # The standard library the model's code came from (the manifest's .py files).
    libdir = os.path.dirname(next(p for p in files if p.endswith(".py")))
    listed = {os.path.basename(p) for p in files}
    modules = sorted(m for m in os.listdir(libdir) if m.endswith(".py") and m not in listed)
    if not modules:
        sys.exit(f"no Python standard-library modules outside the data manifest in {libdir}")
    prompts = []
    for module in modules:
        with open(os.path.join(libdir, module), encoding="utf-8", errors="replace") as f:
            cuts = [c for c in function_openings(f.read()) if not overlaps(c)]
        prompts += cuts[::max(1, len(cuts) // 3)][:3]
    return prompts[::max(1, len(prompts) // n)][:n]


def main():
    out_dir = sys.argv[1]
    n_stories = int(sys.argv[2]) if len(sys.argv) > 2 else 160
    evals = []
    for name in ("story", "code"):
        with open(os.path.join(MODEL, "prompts", name + ".jsonl"), encoding="utf-8") as f:
            evals += [json.loads(line)["prompt"] for line in f if line.strip()]
    heads = [e[:40] for e in evals]

    def overlaps(text):
        return any(h in text for h in heads) or any(text[:40] in e for e in evals)

    stories = []
    for name in ("tinystories_train_head.txt", "tinystories_val_a.txt"):
        with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
            paragraphs = [p.strip() for p in f.read().split("\n\n") if len(p.strip()) > 200]
        # A paragraph next to one an evaluation prompt was cut from may belong
        # to the same story: five paragraphs on each side are skipped too.
        near = set()
        for i, p in enumerate(paragraphs):
            if overlaps(p):
                near.update(range(i - 5, i + 6))
        for i, p in enumerate(paragraphs):
            if len(stories) >= n_stories:
                break
            if i not in near:
                stories.append(p[:200])
    code = stdlib_code_prompts(n_stories, overlaps)
    os.makedirs(out_dir, exist_ok=True)
    for name, prompts in (("story", stories), ("code", code)):
        with open(os.path.join(out_dir, "train-" + name + ".jsonl"), "w", encoding="utf-8") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")
        print(f"wrote {len(prompts)} {name} prompts to {out_dir}/train-{name}.jsonl")


if __name__ == "__main__":
    main()
