#!/usr/bin/python3
"""Writes the text lede-tiny never trained on, for bench/perplexity_main.cc.

usage: bench/heldout_text.py [--out out/heldout-text]

lede-tiny's corpus (scripts/build_corpus.py, recorded in
models/lede-tiny/data_manifest.json) holds out every k-th document of each
domain; those held-out documents are the only text of the repository's
corpus the model never saw. This script rebuilds them from testdata/corpus
with build_corpus.py's own document splitting and selection rule:

  tales.val.txt, drama.val.txt   the held-out split of those domains; their
      sha256 must equal the manifest's (the script fails otherwise), so they
      are byte for byte the files the trainer held out
  stories-tinystories.val.txt    the held-out real TinyStories documents
      (the real ones come first in the stories domain, so their indices do
      not depend on the synthetic stories that followed them, which are not
      in the repository): document i of the real ones is held out when
      i % k == k - 1, k = len(stories) // n_val as build_corpus.py computes
      it; n_val is the manifest's held-out count and len(stories) is between
      n_val / val_fraction and (n_val + 1) / val_fraction, which fixes k
      (the script fails if that range gives two values of k)

Not used: the synthetic held-out stories (their source file is not in the
repository), code (its sources are whatever /usr/lib/python3.11 holds on
the machine), and models/lede-tiny/prompts (held-out prompts, too short for
perplexity).
"""
import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import build_corpus  # noqa: E402  (the splitting rules of the trained corpus)


def read(name):
    with open(os.path.join(ROOT, "testdata", "corpus", name), encoding="utf-8", errors="replace") as f:
        return f.read()


def held_out(docs, n_val, k):
    return [docs[i] for i in range(len(docs)) if i % k == k - 1][:n_val]


def write(path, docs):
    text = ("\n" + build_corpus.DOC_SEP + "\n").join(docs)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "heldout-text"))
    ap.add_argument("--manifest", default=os.path.join(ROOT, "models", "lede-tiny", "data_manifest.json"))
    args = ap.parse_args()
    manifest = json.load(open(args.manifest))
    fraction = manifest["val_fraction"]
    os.makedirs(args.out, exist_ok=True)
    failures = []

    domains = {
        "tales": [d for name in ("grimms_fairy_tales.txt", "alice_in_wonderland.txt")
                  for d in build_corpus.paragraphs_to_docs(build_corpus.strip_gutenberg(read(name)), 600)],
        "drama": build_corpus.paragraphs_to_docs(read("tinyshakespeare.txt"), 600),
    }
    for domain, docs in domains.items():
        n_val = max(1, int(len(docs) * fraction))
        k = max(2, len(docs) // n_val)
        path = os.path.join(args.out, domain + ".val.txt")
        digest = write(path, held_out(docs, n_val, k))
        want = manifest["domains"][domain]["val"]["sha256"]
        if digest != want:
            failures.append(f"{path}: sha256 {digest} is not the manifest's held-out {want}")
        print(f"{path}: {n_val} documents" + (", the manifest's held-out split" if digest == want else "")
              + f" (sha256 {digest[:12]})")

    real = [d for name in ("tinystories_train_head.txt", "tinystories_val_a.txt")
            for d in build_corpus.tinystories_docs(read(name))]
    n_val = manifest["domains"]["stories"]["val"]["documents"]
    lo, hi = int(round(n_val / fraction)), int(round((n_val + 1) / fraction)) - 1
    ks = {max(2, total // n_val) for total in range(lo, hi + 1) if max(1, int(total * fraction)) == n_val}
    if len(ks) != 1:
        failures.append(f"stories: the manifest's {n_val} held-out documents leave k in {sorted(ks)}")
    else:
        k = ks.pop()
        docs = [real[i] for i in range(len(real)) if i % k == k - 1]
        path = os.path.join(args.out, "stories-tinystories.val.txt")
        write(path, docs)
        print(f"{path}: {len(docs)} of the {n_val} held-out stories (the real TinyStories ones; k = {k})")
    for f in failures:
        print("heldout_text.py:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
