#!/usr/bin/env python3
"""Writes the extra prompts LEDE's exit policies train on (never evaluation data).

The evaluation prompts of models/lede-tiny (prompts/story.jsonl, prompts/code.jsonl) were cut
from held-out documents, some of which sit in the same TinyStories files as training stories.
So the story prompts here are story openings from ../shared/data/corpus/tinystories_*.txt whose
text shares no 40-character opening with any evaluation prompt (and vice versa; nor do the five
paragraphs on either side of one that does), and the code
prompts are HumanEval's (../shared/data/prompts/humaneval.jsonl), a different code source than
the evaluation's standard-library functions. Deterministic.

usage: scripts/make_policy_training_prompts.py OUT_DIR [N_STORIES]
"""
import json
import os
import sys

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")
MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "lede-tiny")


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
        with open(os.path.join(SHARED, "data", "corpus", name), encoding="utf-8") as f:
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
    code = []
    with open(os.path.join(SHARED, "data", "prompts", "humaneval.jsonl"), encoding="utf-8") as f:
        for line in f:
            p = json.loads(line)["prompt"]
            if not overlaps(p):
                code.append(p)
    os.makedirs(out_dir, exist_ok=True)
    for name, prompts in (("story", stories), ("code", code)):
        with open(os.path.join(out_dir, "train-" + name + ".jsonl"), "w", encoding="utf-8") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")
        print(f"wrote {len(prompts)} {name} prompts to {out_dir}/train-{name}.jsonl")


if __name__ == "__main__":
    main()
