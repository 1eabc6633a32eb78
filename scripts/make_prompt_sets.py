#!/usr/bin/env python3
"""Cuts held-out prompt sets for lede-tiny from the corpus' validation splits.

story.jsonl: the opening (first 20 words) of held-out stories.
code.jsonl:  the first lines of held-out Python functions and classes (from `def`/`class` lines).
Each line is {"prompt": ..., "source": ...}. Deterministic.
usage: make_prompt_sets.py CORPUS_DIR OUT_DIR [N]
"""
import json
import os
import re
import sys

SEP = "\n<|doc|>\n"


def docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in f.read().split(SEP) if d.strip()]


def function_openings(source):
    """Code prompts cut from Python `source`: each `def`/`class` line with the three lines after
    it, where at least eight more lines follow (the generation has code to continue)."""
    lines = source.split("\n")
    return ["\n".join(lines[i:i + 4]) + "\n" for i, line in enumerate(lines)
            if re.match(r"\s*(def|class) \w+", line) and i + 8 < len(lines)]


def main():
    corpus, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 48
    os.makedirs(out, exist_ok=True)
    stories = []
    for d in docs(os.path.join(corpus, "stories.val.txt")):
        words = d.split()
        if len(words) < 40:
            continue
        stories.append({"prompt": " ".join(words[:20]), "source": "stories.val"})
        if len(stories) == n:
            break
    code = []
    for d in docs(os.path.join(corpus, "code.val.txt")):
        code += [{"prompt": p, "source": "code.val"} for p in function_openings(d)]
        if len(code) >= 4 * n:
            break
    code = code[:: max(1, len(code) // n)][:n]
    for name, rows in (("story", stories), ("code", code)):
        with open(os.path.join(out, name + ".jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"{name}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
