#!/usr/bin/python3
"""Checks that the repository stands alone with its test data.

usage: testdata_test.py checksums | self-contained

  checksums       every file listed in testdata/SHA256SUMS has its checksum, and
                  every data file under testdata/ (not the *.md pages and licence
                  texts) is listed
  self-contained  no tracked file refers to the "shared" folder that once lay
                  beside the checkout (tests, scripts and the build read testdata/)
Exit status 0 = pass, 1 = fail (each problem on its own line).
"""
import hashlib
import os
import subprocess
import sys

# The folder beside the checkout that tests and scripts once read; spelled
# apart so that this file does not match itself.
BESIDE = os.path.join("..", "shared")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DATA = os.path.join(ROOT, "testdata")


def check_checksums():
    problems, listed = [], set()
    with open(os.path.join(DATA, "SHA256SUMS")) as f:
        for line in f:
            if not line.strip():
                continue
            want, name = line.split(None, 1)
            name = name.strip().lstrip("*")
            listed.add(os.path.normpath(name))
            path = os.path.join(DATA, name)
            if not os.path.isfile(path):
                problems.append(f"testdata/{name}: listed in SHA256SUMS, missing")
                continue
            h = hashlib.sha256()
            with open(path, "rb") as data:
                for chunk in iter(lambda: data.read(1 << 20), b""):
                    h.update(chunk)
            if h.hexdigest() != want:
                problems.append(f"testdata/{name}: sha256 {h.hexdigest()}, SHA256SUMS says {want}")
    for top in ("models", "corpus", "prompts"):
        for dirpath, _, names in os.walk(os.path.join(DATA, top)):
            for n in names:
                rel = os.path.normpath(os.path.relpath(os.path.join(dirpath, n), DATA))
                if not n.endswith(".md") and rel not in listed:
                    problems.append(f"testdata/{rel}: not in SHA256SUMS (testdata/SOURCES.md says how to add a file)")
    return problems


def check_self_contained():
    out = subprocess.run(["git", "grep", "-n", "-I", "-F", BESIDE],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 1:  # no match
        return []
    if out.returncode != 0:
        return [] if "not a git repository" in out.stderr else [f"git grep: {out.stderr.strip()}"]
    return [f"{line}: refers to {BESIDE} (use testdata/)" for line in out.stdout.splitlines()]


def main(argv):
    checks = {"checksums": check_checksums, "self-contained": check_self_contained}
    if len(argv) != 2 or argv[1] not in checks:
        print(__doc__)
        return 2
    problems = checks[argv[1]]()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
