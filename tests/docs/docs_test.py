#!/usr/bin/python3
"""Checks the documentation against what it is generated from and links to.

usage: docs_test.py tables | links | readme | reference | --self-test

  tables  every generated table (scripts/make_docs_tables.py markers in README.md,
          docs/*.md and the model card) is what its JSON renders to, every
          bench/results/*.json records its command, commit, date and machine,
          and every one of them is used by a table (bench/results/README.md)
  links   every relative link in README.md, docs/*.md and the other Markdown
          pages they point into resolves: the file exists and, for a link into
          a Markdown file, so does the #anchor (GitHub's heading ids)
  readme  README.md is a front door: at most 250 lines, at most 3 dated lines
  reference  the pages state what is: docs/benchmarks.md at most 400 lines, and
          outside generated tables no dated line and no "issue N" pointer in
          README.md, docs/*.md or deploy/README.md
Exit status 0 = pass, 1 = fail (each problem on its own line).
"""
import glob
import json
import os
import re
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import make_docs_tables  # noqa: E402

LINK_PAGES = ("README.md", "docs/*.md", "models/lede-tiny/README.md", "deploy/README.md", "testdata/*.md",
              "testdata/models/*.md")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def check_tables(root=ROOT):
    problems = []
    for path in sorted(glob.glob(os.path.join(root, "bench", "results", "*.json"))):
        rel = os.path.relpath(path, root)
        try:
            with open(path) as f:
                data = json.load(f)
        except ValueError as e:
            problems.append(f"{rel}: not JSON ({e})")
            continue
        missing = [k for k in make_docs_tables.PROVENANCE_KEYS if not data.get(k)]
        if missing:
            problems.append(f"{rel}: records no {', '.join(missing)} (write results with bench/record.py)")
    used = set()
    for doc in make_docs_tables.docs():
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            used.update(m.group("spec").split()[0] for m in make_docs_tables.MARKER.finditer(f.read()))
    for path in sorted(glob.glob(os.path.join(root, "bench", "results", "*.json"))):
        rel = os.path.relpath(path, root)
        if rel not in used:
            problems.append(f"{rel}: no table uses it (delete it; git history keeps it: bench/results/README.md)")
    try:
        stale = make_docs_tables.process(check=True)
    except (make_docs_tables.DocsError, OSError, KeyError, ValueError) as e:
        return problems + [f"scripts/make_docs_tables.py: {e}"]
    problems += [f"{s}: differs from what its JSON renders to (run scripts/make_docs_tables.py)" for s in stale]
    return problems


def slug(heading):
    """GitHub's id of a Markdown heading."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = text.replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    seen, out = {}, set()
    for line in text.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def check_links(root=ROOT, pages=LINK_PAGES):
    problems = []
    files = []
    for pattern in pages:
        files += sorted(glob.glob(os.path.join(root, pattern)))
    for page in files:
        rel = os.path.relpath(page, root)
        with open(page, encoding="utf-8") as f:
            text = INLINE_CODE.sub("", FENCE.sub("", f.read()))
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # absolute URL: not checked (no network)
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(dest):
                problems.append(f"{rel}: link {target}: {os.path.relpath(dest, root)} does not exist")
                continue
            if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
                problems.append(f"{rel}: link {target} leaves the repository")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{rel}: link {target}: no heading #{anchor} in {os.path.relpath(dest, root)}")
    return problems


def check_readme(root=ROOT):
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    problems = []
    if len(lines) > 250:
        problems.append(f"README.md: {len(lines)} lines (at most 250: reference goes to docs/)")
    dated = [i + 1 for i, line in enumerate(lines) if DATE.search(line)]
    if len(dated) > 3:
        problems.append(f"README.md: {len(dated)} dated lines (at most 3; run history goes to git): lines {dated}")
    return problems


REFERENCE_PAGES = ("README.md", "docs/*.md", "deploy/README.md")
ISSUE = re.compile(r"\bissues? #?\d+", re.I)
BENCHMARKS_MAX_LINES = 400


def check_reference(root=ROOT, pages=REFERENCE_PAGES):
    problems = []
    bench = os.path.join(root, "docs", "benchmarks.md")
    if os.path.exists(bench):
        with open(bench, encoding="utf-8") as f:
            n = len(f.read().splitlines())
        if n > BENCHMARKS_MAX_LINES:
            problems.append(f"docs/benchmarks.md: {n} lines (at most {BENCHMARKS_MAX_LINES}: one table per question; "
                            "run history goes to git)")
    files = []
    for pattern in pages:
        files += sorted(glob.glob(os.path.join(root, pattern)))
    for page in files:
        rel = os.path.relpath(page, root)
        with open(page, encoding="utf-8") as f:
            text = make_docs_tables.MARKER.sub(lambda m: "\n" * m.group(0).count("\n"), f.read())
        for i, line in enumerate(text.splitlines(), 1):
            if rel != "README.md" and DATE.search(line):
                problems.append(f"{rel}:{i}: a dated line outside a generated table (state what is)")
            if ISSUE.search(line):
                problems.append(f"{rel}:{i}: \"{ISSUE.search(line).group(0)}\" points into a tracker that is not in "
                                "the repository (state the reason, or cite docs/design.md)")
    return problems


def self_test():
    """The link checker finds a missing file and a missing anchor, and passes good links."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("# A page\n\n## Section `two` (x)\n\n[ok](b.md) [ok](#a-page) [ok](a.md#section-two-x) "
                    "[web](https://example.com) `[code](missing.md)`\n[bad](missing.md) [bad](b.md#nowhere)\n"
                    "```\n[fenced](missing.md)\n```\n")
        with open(os.path.join(root, "docs", "b.md"), "w") as f:
            f.write("# B\n")
        got = check_links(root, ("docs/*.md",))
        want = ["docs/a.md: link missing.md: docs/missing.md does not exist",
                "docs/a.md: link b.md#nowhere: no heading #nowhere in docs/b.md"]
        if got != want:
            print("self-test: links:\n  got  %s\n  want %s" % (got, want))
            return 1
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("x\n" * 251 + "2026-01-01\n" * 4)
        if len(check_readme(root)) != 2:
            print("self-test: readme: %s" % check_readme(root))
            return 1
        with open(os.path.join(root, "docs", "benchmarks.md"), "w") as f:
            f.write("x\n" * 401 + "<!-- table: bench/results/x.json -->\n2026-01-01\n<!-- /table -->\n"
                    "see issue 12\nrun on 2026-01-02\n")
        got = check_reference(root, ("docs/*.md",))
        want = ["docs/benchmarks.md: 406 lines (at most 400: one table per question; run history goes to git)",
                "docs/benchmarks.md:405: \"issue 12\" points into a tracker that is not in the repository "
                "(state the reason, or cite docs/design.md)",
                "docs/benchmarks.md:406: a dated line outside a generated table (state what is)"]
        if got != want:
            print("self-test: reference:\n  got  %s\n  want %s" % (got, want))
            return 1
    return 0


def main(argv):
    if len(argv) != 2 or argv[1] not in ("tables", "links", "readme", "reference", "--self-test"):
        print(__doc__)
        return 2
    if argv[1] == "--self-test":
        return self_test()
    problems = {"tables": check_tables, "links": check_links, "readme": check_readme,
                "reference": check_reference}[argv[1]]()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
