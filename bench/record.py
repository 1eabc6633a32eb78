#!/usr/bin/python3
"""Runs a benchmark and records its JSON with where it came from, under bench/results/.

usage: bench/record.py OUT.json -- COMMAND... [-- COMMAND...]
       bench/record.py OUT.json --from FILE --command "HOW FILE WAS MADE"

Each COMMAND runs from the repository root with every `{json}` in it replaced
by a temporary file, which the benchmark writes (its --json, --out, ...).
Several commands (e.g. one prompt set each) are run one after the other, never
at once, and their results merged: objects key by key, lists end to end, the
first command's scalars kept. --from records a JSON a script already wrote.

OUT gets the benchmark's own fields plus
  command  this invocation, as typed (what reproduces OUT)
  commit   `git rev-parse HEAD`, with "-dirty" when tracked files outside bench/results differ from it
  date     UTC, ISO 8601
  machine  CPU model, cores, memory, AVX-512, GPUs, OS
which scripts/make_docs_tables.py prints under every table it renders from OUT.
"""
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROVENANCE_KEYS = ("command", "commit", "date", "machine")


def git(*args):
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def commit():
    head = git("rev-parse", "HEAD")
    if head is None:
        return "unknown"
    # Results under bench/results are outputs, not the code measured: a run that follows another in the
    # same session finds the first one's JSON changed and is still at the commit's code.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return head + ("-dirty" if dirty else "")


def machine():
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    cpu = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    memory_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    memory_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    gpus = []
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True)
        gpus = [g.strip() for g in out.stdout.splitlines() if g.strip()] if out.returncode == 0 else []
    os_name = platform.system()
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory_gib,
            "avx512": "avx512f" in flags, "gpus": gpus, "os": os_name}


def merge(into, part):
    for key, value in part.items():
        if key not in into:
            into[key] = value
        elif isinstance(into[key], dict) and isinstance(value, dict):
            merge(into[key], value)
        elif isinstance(into[key], list) and isinstance(value, list):
            into[key] = into[key] + value
    return into


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help") else 2
    out = argv[1]
    invocation = shlex.join(["bench/record.py"] + argv[1:])
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    head = commit()  # before the run: the code that was measured
    if argv[2] == "--from":
        if len(argv) != 6 or argv[4] != "--command":
            print("usage: bench/record.py OUT.json --from FILE --command CMD", file=sys.stderr)
            return 2
        with open(argv[3]) as f:
            result = json.load(f)
        invocation = argv[5]
    elif argv[2] == "--":
        commands, cur = [], []
        for arg in argv[3:]:
            if arg == "--":
                commands.append(cur)
                cur = []
            else:
                cur.append(arg)
        commands.append(cur)
        if any(not c for c in commands):
            print("bench/record.py: an empty command", file=sys.stderr)
            return 2
        result = {}
        with tempfile.TemporaryDirectory() as tmp:
            for i, cmd in enumerate(commands):
                path = os.path.join(tmp, "result-%d.json" % i)
                print("bench/record.py: " + shlex.join(cmd), file=sys.stderr, flush=True)
                rc = subprocess.run([a.replace("{json}", path) for a in cmd], cwd=ROOT).returncode
                if rc != 0:
                    print("bench/record.py: exit status %d; %s not written" % (rc, out), file=sys.stderr)
                    return rc
                with open(path) as f:
                    merge(result, json.load(f))
    else:
        print("usage: bench/record.py OUT.json -- COMMAND... (see --help)", file=sys.stderr)
        return 2
    for key in PROVENANCE_KEYS:
        result.pop(key, None)
    record = {"command": invocation, "commit": head, "date": when, "machine": machine()}
    record.update(result)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print("bench/record.py: wrote %s; now run scripts/make_docs_tables.py" % out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
