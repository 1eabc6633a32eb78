#!/usr/bin/python3
"""Interleaved A/B of `lede generate --mode ar` decode tok/s over GGUF files.

usage: bench/ggml_decode_ab.py --out OUT.json --lede NAME=PATH [--lede NAME=PATH ...]
           --gguf FILE [--gguf FILE ...] [--threads 1] [--tokens 48] [--rounds 2]

Each round runs every (binary, file) pair once, in an order that alternates
between rounds, so load on a shared machine falls on every pair alike. One
process per pair and round: the first prompt once as an uncounted warm-up,
then the held-out story prompts 24..26 of models/lede-tiny/prompts/story.jsonl.
tok/s of a pair = its decode tokens / its decode seconds over all rounds
(from the "[ar] N tokens, X tokens/s" lines lede generate prints).
"""
import argparse
import json
import os
import re
import subprocess
import tempfile

SEP = "<|ab-end|>"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lede", action="append", required=True)
    ap.add_argument("--gguf", action="append", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "models/lede-tiny/prompts/story.jsonl")) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()][24:27]
    bins = [b.split("=", 1) for b in a.lede]
    pairs = [(name, path, g) for name, path in bins for g in a.gguf]
    stats = {(n, g): [0, 0.0] for n, _, g in pairs}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pf:
        pf.write("\n".join([prompts[0]] + prompts) + "\n")
    for rnd in range(a.rounds):
        for name, path, g in (pairs if rnd % 2 == 0 else list(reversed(pairs))):
            r = subprocess.run([path, "generate", "--model", g, "--prompt-file", pf.name, "--separator", SEP,
                                "--mode", "ar", "--max-new-tokens", str(a.tokens), "--threads", str(a.threads)],
                               capture_output=True, text=True, check=True)
            lines = re.findall(r"^\[[^\]]+\] (\d+) tokens, ([0-9.]+) tokens/s", r.stderr, re.M)[1:]
            for t, s in lines:
                stats[(name, g)][0] += int(t)
                stats[(name, g)][1] += int(t) / float(s)
    os.unlink(pf.name)
    rows = [{"binary": n, "gguf": os.path.basename(g), "tokens": t, "decode_s": round(s, 3),
             "tok_s": round(t / s, 2)} for (n, g), (t, s) in stats.items()]
    for row in rows:
        print(row)
    with open(a.out, "w") as f:
        json.dump({"benchmark": "ggml_decode_ab", "threads": a.threads, "tokens": a.tokens, "rounds": a.rounds,
                   "prompts": "story.jsonl 24..26 (held out)", "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
