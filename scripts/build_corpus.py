#!/usr/bin/env python3
"""Builds the lede-tiny training corpus with a held-out split per domain.

Domains (all local, nothing downloaded):
  stories: TinyStories head + validation part (testdata/corpus), plus
           synthetic stories sampled from stories260K if OUT/synthetic_stories.txt exists
  tales:   Grimms' fairy tales + Alice in Wonderland (Project Gutenberg header/footer stripped)
  drama:   tinyshakespeare
  code:    Python 3.11 standard library sources installed by Debian (/usr/lib/python3.11),
           a deterministic subset of whole files up to --code-bytes

Documents are separated by a line holding only <|doc|>; the trainer starts each document
with BOS. Every k-th document of each domain (--val-fraction of them) is held out.
--extra-train-stories FILE adds synthetic stories to the stories training split only, so a
continued-pretraining corpus keeps the held-out split of the corpus it extends.
Writes OUT/<domain>.train.txt, OUT/<domain>.val.txt, OUT/spm_input.txt (training text for the
tokenizer, one paragraph per line), OUT/manifest.json (files, sizes, sha256, document counts) and
OUT/heldout/stories-{tinystories,synthetic}.val.txt (the held-out stories by source).
"""
import argparse
import hashlib
import json
import os
import re
import sys

DOC_SEP = "<|doc|>"


REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def manifest_path(path):
    """A source's name in the manifest: relative to the repository when inside it (testdata/, out/), else absolute."""
    real = os.path.realpath(path)
    return os.path.relpath(real, REPO) if real.startswith(REPO + os.sep) else real


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def strip_gutenberg(text):
    start = re.search(r"\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG[^\n]*\n", text)
    end = re.search(r"\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG", text)
    begin = start.end() if start else 0
    finish = end.start() if end else len(text)
    return text[begin:finish].strip()


def paragraphs_to_docs(text, min_chars):
    """Groups blank-line-separated paragraphs into documents of at least min_chars."""
    docs, cur = [], []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        cur.append(para)
        if sum(len(p) for p in cur) >= min_chars:
            docs.append("\n\n".join(cur))
            cur = []
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def tinystories_docs(text):
    # Stories are separated by blank lines like their paragraphs; a story begins with a
    # capitalised opener in most cases. Treat every paragraph as a document start.
    return [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 40]


def code_files(root, budget):
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "idlelib", "site-packages",
                                                              "dist-packages", "__pycache__", "lib2to3"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                files.append(os.path.join(dirpath, name))
    out, total = [], 0
    for path in files:
        size = os.path.getsize(path)
        if size < 2000 or size > 60000:
            continue
        out.append(path)
        total += size
        if total >= budget:
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "corpus"),
                    help="the source texts (default: testdata/corpus of this repository)")
    ap.add_argument("--out", default="out/corpus")
    ap.add_argument("--code-root", default="/usr/lib/python3.11")
    ap.add_argument("--code-bytes", type=int, default=1_500_000)
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--synthetic", default=None,
                    help="synthetic stories (<|doc|>-separated); default OUT/synthetic_stories.txt if present")
    ap.add_argument("--extra-train-stories", action="append", default=[],
                    help="more synthetic stories for the stories training split only (held-out unchanged); "
                         "repeatable")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    corpus = args.corpus
    sources, domains = [], {}

    def read(path):
        sources.append({"file": manifest_path(path), "bytes": os.path.getsize(path), "sha256": sha256(path)})
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    stories = []
    for name in ("tinystories_train_head.txt", "tinystories_val_a.txt"):
        stories += tinystories_docs(read(os.path.join(corpus, name)))
    n_real_stories = len(stories)  # the synthetic ones follow
    synthetic = args.synthetic or os.path.join(args.out, "synthetic_stories.txt")
    if os.path.exists(synthetic):
        stories += [d.strip() for d in read(synthetic).split(DOC_SEP) if len(d.strip()) > 40]
    domains["stories"] = stories
    tales = []
    for name in ("grimms_fairy_tales.txt", "alice_in_wonderland.txt"):
        tales += paragraphs_to_docs(strip_gutenberg(read(os.path.join(corpus, name))), 600)
    domains["tales"] = tales
    domains["drama"] = paragraphs_to_docs(read(os.path.join(corpus, "tinyshakespeare.txt")), 600)
    domains["code"] = [read(p).strip() for p in code_files(args.code_root, args.code_bytes)]

    manifest = {"sources": sources, "domains": {}, "doc_separator": DOC_SEP, "val_fraction": args.val_fraction}
    spm_lines = []
    for domain, docs in domains.items():
        n_val = max(1, int(len(docs) * args.val_fraction))
        # Interleave the held-out documents deterministically (every k-th) so both splits
        # cover every source of the domain.
        k = max(2, len(docs) // n_val)
        val_index = [i for i in range(len(docs)) if i % k == k - 1][:n_val]
        val = [docs[i] for i in val_index]
        val_ids = set(i for i, d in enumerate(docs) if i % k == k - 1 and len(val) > 0)
        train = [d for i, d in enumerate(docs) if i not in val_ids]
        for extra in args.extra_train_stories if domain == "stories" else []:
            train += [d.strip() for d in read(extra).split(DOC_SEP) if len(d.strip()) > 40]
        for split, items in (("train", train), ("val", val)):
            path = os.path.join(args.out, f"{domain}.{split}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(("\n" + DOC_SEP + "\n").join(items))
            manifest["domains"].setdefault(domain, {})[split] = {
                "file": os.path.basename(path), "documents": len(items),
                "bytes": os.path.getsize(path), "sha256": sha256(path)}
        if domain == "stories":
            os.makedirs(os.path.join(args.out, "heldout"), exist_ok=True)
            n_real_val = sum(1 for i in val_index if i < n_real_stories)
            for source, items in (("tinystories", val[:n_real_val]), ("synthetic", val[n_real_val:])):
                with open(os.path.join(args.out, "heldout", f"stories-{source}.val.txt"), "w", encoding="utf-8") as f:
                    f.write(("\n" + DOC_SEP + "\n").join(items))
        for d in train:
            spm_lines += [line for line in d.split("\n") if line.strip()]
    with open(os.path.join(args.out, "spm_input.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(spm_lines) + "\n")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    for domain, info in manifest["domains"].items():
        print(f"{domain:8s} train {info['train']['documents']:6d} docs {info['train']['bytes']:9d} B   "
              f"val {info['val']['documents']:5d} docs {info['val']['bytes']:8d} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
