#!/usr/bin/python3
"""Held-out code prompts the project never trained or tuned on.

The demo model's code corpus is the Python 3.11 standard library
(scripts/build_corpus.py) and its code prompts are HumanEval; these prompts
come from third-party Python packages Debian 12 installs under
/usr/lib/python3/dist-packages, outside the standard library, under
permissive licences (BSD, MIT/Expat, Apache-2.0). Each prompt is cut like HumanEval's: a
function's `def` line(s) and its docstring, dedented, ending in a newline, so
the model continues with the body.

The rows are shuffled with a fixed seed (packages mixed) and written as JSON
lines with task_id (package/module:qualname), prompt, package, version and
licence. testdata/prompts/debian_python.jsonl was made by

    scripts/make_debian_code_prompts.py --out testdata/prompts/debian_python.jsonl

on Debian 12 (the package versions are in each row); rerunning it on the same
packages gives the same file. testdata/SOURCES.md has the provenance and
testdata/licenses/debian-python/ the packages' Debian copyright files.

usage: scripts/make_debian_code_prompts.py --out FILE [--count 300] [--seed 37]
                                           [--max-chars 800] [--root DIR]
"""
import argparse
import ast
import json
import os
import random
import subprocess
import sys
import textwrap

# dist-packages folder -> (Debian package, licence). Only permissive licences.
PACKAGES = {
    "jinja2": ("python3-jinja2", "BSD-3-Clause"),
    "pygments": ("python3-pygments", "BSD-2-Clause"),
    "pyparsing": ("python3-pyparsing", "MIT"),
    "yaml": ("python3-yaml", "MIT"),
    "six.py": ("python3-six", "MIT"),
    "toml": ("python3-toml", "MIT"),
    "oauthlib": ("python3-oauthlib", "BSD-3-Clause"),
    "xmltodict.py": ("python3-xmltodict", "MIT"),
    "jwt": ("python3-jwt", "MIT"),
    "pyflakes": ("python3-pyflakes", "MIT"),
    "blinker": ("python3-blinker", "MIT"),
    "distro": ("python3-distro", "Apache-2.0"),
}


def package_version(deb):
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", deb], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def python_files(path):
    if os.path.isfile(path):
        yield path
        return
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and d != "tests"]
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield os.path.join(dirpath, f)


def prompts_of(path, root, max_chars):
    """(qualname, prompt) for each function with a docstring in `path`."""
    try:
        source = open(path, encoding="utf-8").read()
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return
    lines = source.splitlines(keepends=True)

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = child.body
                if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                        and isinstance(body[0].value.value, str) and len(body) > 1):
                    doc = body[0].value.value.strip()
                    if len(doc) >= 30:
                        text = textwrap.dedent("".join(lines[child.lineno - 1:body[0].end_lineno]))
                        if not text.endswith("\n"):
                            text += "\n"
                        if len(text) <= max_chars and text.lstrip().startswith(("def ", "async def ")):
                            yield prefix + child.name, text
                visit(child, prefix + child.name + ".")

    yield from visit(tree, "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--max-chars", type=int, default=800)
    ap.add_argument("--root", default="/usr/lib/python3/dist-packages")
    a = ap.parse_args()
    if a.count < 1:
        sys.exit("make_debian_code_prompts: --count must be >= 1")
    rows = []
    for folder, (deb, licence) in sorted(PACKAGES.items()):
        path = os.path.join(a.root, folder)
        if not os.path.exists(path):
            sys.exit(f"make_debian_code_prompts: {path} is missing (apt-get install {deb})")
        version = package_version(deb)
        for f in python_files(path):
            module = os.path.relpath(f, a.root)[:-3].replace(os.sep, ".")
            for qualname, prompt in prompts_of(f, a.root, a.max_chars):
                rows.append({"task_id": f"{folder.removesuffix('.py')}/{module}:{qualname}", "prompt": prompt,
                             "package": deb, "version": version, "licence": licence})
    seen, unique = set(), []
    for r in rows:  # one row per distinct prompt text
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            unique.append(r)
    random.Random(a.seed).shuffle(unique)
    if len(unique) < a.count:
        sys.exit(f"make_debian_code_prompts: only {len(unique)} prompts, asked for {a.count}")
    with open(a.out, "w", encoding="utf-8") as out:
        for r in unique[:a.count]:
            out.write(json.dumps(r, ensure_ascii=False) + "\n")
    by_pkg = {}
    for r in unique[:a.count]:
        by_pkg[r["package"]] = by_pkg.get(r["package"], 0) + 1
    print(f"wrote {a.count} of {len(unique)} prompts to {a.out}: " +
          ", ".join(f"{k} {v}" for k, v in sorted(by_pkg.items())))


if __name__ == "__main__":
    main()
