#!/usr/bin/python3
"""A large model through scripts/run with its defaults (issue: serve the files
and machines users have): start time, KV memory, concurrent long prompts, a
request beyond the KV budget, and prefill speed against `lede generate`.

Model: the Llama-3.2-1B-shaped smoke checkpoint (scripts/make_llama32_1b_smoke.py,
written into build/smoke/llama32-1b if missing). Steps, in order:
  start       `scripts/run --detach` on a fresh state directory (so the cold
              start's self-calibration runs), timed from launch to "LEDE is up";
              the cold start's own seconds from its log
  kv          the verifier's kv_pool_planned event (budget, slots, capacity,
              block size, blocks, pool bytes), the shared-memory segment's size, and each
              process's peak RSS (VmHWM) at the end
  over_budget a prompt past what one sequence may hold (halfway to the window):
              its HTTP status and message, then a short request (the
              services stay up)
  prefill     a --prefill-tokens prompt, max_tokens 1, through the services
              (client wall) and `lede generate --threads T` (its prefill
              seconds), interleaved --repeats times: the ratio of each pair
              is what a busy machine distorts least
  concurrent  --concurrency requests of --prompt-tokens tokens and
              --new-tokens new tokens at once (greedy): status, tokens, wall
Nothing asserts; it prints and writes JSON (--json FILE).

usage: bench/big_model_serving.py [--build build] [--model DIR] [--threads N]
           [--prompt-tokens 2000] [--new-tokens 64] [--concurrency 8]
           [--prefill-tokens 2000] [--repeats 2] [--ports-base 700] [--json FILE]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCE = "The river flows past the old mill. "


def log(msg):
    print(msg, flush=True)


def tokens_per_sentence(lede, model):
    out = subprocess.run([lede, "tokenize", "--model", model, SENTENCE * 4], capture_output=True, text=True,
                         check=True).stdout
    ids = json.loads(out.strip().splitlines()[0])
    return (len(ids) - 1) / 4.0  # less BOS


def prompt_of(n_tokens, per_sentence):
    return SENTENCE * max(1, int(round(n_tokens / per_sentence)))


def complete(port, prompt, max_tokens, timeout=1800):
    """POST /v1/completions; returns (http status, body dict, wall seconds)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.time() - t0
    except urllib.error.HTTPError as e:
        try:
            payload = json.loads(e.read())
        except ValueError:
            payload = {}
        return e.code, payload, time.time() - t0
    except (urllib.error.URLError, OSError) as e:
        return 0, {"error": {"message": str(e)}}, time.time() - t0


def kv_plan(logs):
    text = open(os.path.join(logs, "verifier.log")).read()
    m = re.search(r"event=kv_pool_planned(.*)", text)
    fields = dict(re.findall(r"(\w+)=\"?([^\s\"]+)\"?", m.group(1))) if m else {}
    return {k: (int(v) if v.isdigit() else v) for k, v in fields.items()}


def peak_rss(pidfile):
    out = {}
    for line in open(pidfile):
        name, pid = line.split()
        if name in ("shm", "drain_s", "supervisor"):
            continue
        try:
            status = open("/proc/%s/status" % pid).read()
            out[name] = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
        except (OSError, AttributeError):
            pass
    return out


def segment_bytes(pidfile):
    for line in open(pidfile):
        name, value = line.split()
        if name == "shm":
            path = "/dev/shm/" + value.lstrip("/")
            return os.stat(path).st_size if os.path.exists(path) else None
    return None


def cli_prefill(lede, model, prompt, threads):
    """`lede generate --threads T --max-new-tokens 1`: its prefill seconds."""
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    r = subprocess.run([lede, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "1",
                        "--mode", "ar", "--threads", str(threads)], capture_output=True, text=True, env=env)
    m = re.search(r"\(prefill ([0-9.]+) s\)", r.stderr)
    if not m:
        raise RuntimeError("lede generate printed no prefill time:\n" + r.stderr[-2000:])
    return float(m.group(1))


def step_start(args, env, state):
    t0 = time.time()
    r = subprocess.run([os.path.join(ROOT, "scripts", "run"), "--model", args.model, "--state-dir", state,
                        "--ports-base", str(args.ports_base), "--detach"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError("scripts/run failed (%d):\n%s\n%s" % (r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
    text = open(os.path.join(state, "logs", "cold-start.log")).read()
    cold = re.search(r"load_seconds=([0-9.]+) seconds=([0-9.]+)", text)
    sizing = re.search(r"cold start sizing\" (.*)", text)
    return {"start_s": round(wall, 2), "cold_start_s": float(cold.group(2)) if cold else None,
            "cold_start_load_s": float(cold.group(1)) if cold else None,
            "cold_start_sizing": sizing.group(1) if sizing else None}


def step_over_budget(port, capacity, window, per_sentence):
    # Past what one sequence may hold (the KV budget) but within the model's
    # window, well past either bound whatever the tokenizer makes of the
    # joins: halfway between them, or twice the capacity when the budget
    # holds the whole window (then only the window can refuse it).
    n = (capacity + window) // 2 if capacity < window else 2 * capacity
    prompt = prompt_of(n, per_sentence)
    status, body, wall = complete(port, prompt, 8)
    after, after_body, _ = complete(port, "Once upon a time", 4)
    return {"prompt_tokens_about": int(len(prompt) / len(SENTENCE) * per_sentence), "status": status,
            "message": body.get("error", {}).get("message"), "wall_s": round(wall, 2),
            "next_request_status": after,
            "next_request_tokens": after_body.get("usage", {}).get("completion_tokens")}


def step_prefill(args, lede, port, per_sentence):
    prompt = prompt_of(args.prefill_tokens, per_sentence)
    pairs = []
    for i in range(args.repeats):
        cli = cli_prefill(lede, args.model, prompt, args.threads)
        status, body, wall = complete(port, prompt, 1)
        pairs.append({"cli_prefill_s": round(cli, 2), "services_s": round(wall, 2), "services_status": status,
                      "prompt_tokens": body.get("usage", {}).get("prompt_tokens"),
                      "ratio": round(wall / cli, 3)})
        log("  prefill %d: lede generate %.1f s, services %.1f s (%s), ratio %.3f" %
            (i, cli, wall, status, wall / cli))
    ratios = sorted(p["ratio"] for p in pairs)
    return {"prompt_tokens": pairs[0]["prompt_tokens"], "pairs": pairs, "median_ratio": ratios[len(ratios) // 2]}


def step_concurrent(args, port, per_sentence):
    prompt = prompt_of(args.prompt_tokens, per_sentence)
    results = [None] * args.concurrency
    def one(i):
        # A different first word per request: no two prompts are equal.
        status, body, wall = complete(port, "Request %d. " % i + prompt, args.new_tokens)
        results[i] = {"status": status, "wall_s": round(wall, 2),
                      "prompt_tokens": body.get("usage", {}).get("prompt_tokens"),
                      "completion_tokens": body.get("usage", {}).get("completion_tokens"),
                      "error": body.get("error", {}).get("message")}
    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    done = sum(1 for r in results if r["status"] == 200 and r["completion_tokens"] == args.new_tokens)
    return {"requests": results, "completed": done, "wall_s": round(wall, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("LEDE_BUILD_DIR", "build"))
    ap.add_argument("--model", default=None, help="default: BUILD/smoke/llama32-1b (made if missing)")
    ap.add_argument("--threads", type=int, default=2, help="LEDE_THREADS and lede generate --threads")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prefill-tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ports-base", type=int, default=700)
    ap.add_argument("--skip", default="", help="comma-separated steps to skip: over_budget,prefill,concurrent")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    build = os.path.join(ROOT, args.build) if not os.path.isabs(args.build) else args.build
    args.model = os.path.abspath(args.model or os.path.join(build, "smoke", "llama32-1b"))
    if not os.path.exists(os.path.join(args.model, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_llama32_1b_smoke.py"), args.model],
                       check=True)
    lede = os.path.join(build, "services", "cli", "lede")
    skip = set(filter(None, args.skip.split(",")))
    per_sentence = tokens_per_sentence(lede, args.model)
    state = tempfile.mkdtemp(prefix="lede-big-model-")
    env = dict(os.environ, LEDE_BUILD_DIR=build, LEDE_THREADS=str(args.threads))
    for k in ("LEDE_KV_MEMORY", "LEDE_SLOTS", "LEDE_WEIGHTS", "LEDE_MAX_BATCH"):
        env.pop(k, None)  # the defaults
    port = 8000 + args.ports_base
    out = {"model": os.path.basename(args.model), "threads": args.threads, "nproc": os.cpu_count(),
           "settings": {"prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                        "concurrency": args.concurrency, "prefill_tokens": args.prefill_tokens,
                        "repeats": args.repeats}}
    try:
        log("start: scripts/run --detach (cold start included)")
        out["start"] = step_start(args, env, state)
        log("  %s" % out["start"])
        out["kv"] = kv_plan(os.path.join(state, "logs"))
        out["kv"]["segment_bytes"] = segment_bytes(os.path.join(state, "pids"))
        log("  kv: %s" % out["kv"])
        if "over_budget" not in skip:
            log("over_budget: a prompt beyond what one sequence may hold")
            out["over_budget"] = step_over_budget(port, int(out["kv"]["capacity_tokens"]),
                                                  int(out["kv"]["window_tokens"]), per_sentence)
            log("  %s" % out["over_budget"])
        if "prefill" not in skip:
            log("prefill: services vs lede generate --threads %d, interleaved" % args.threads)
            out["prefill"] = step_prefill(args, lede, port, per_sentence)
        if "concurrent" not in skip:
            log("concurrent: %d x %d-token prompts, %d new tokens" %
                (args.concurrency, args.prompt_tokens, args.new_tokens))
            out["concurrent"] = step_concurrent(args, port, per_sentence)
            log("  completed %d of %d in %.1f s" % (out["concurrent"]["completed"], args.concurrency,
                                                   out["concurrent"]["wall_s"]))
        out["peak_rss_bytes"] = peak_rss(os.path.join(state, "pids"))
        log("  peak RSS: %s" % out["peak_rss_bytes"])
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "run"), "--stop", "--state-dir", state], cwd=ROOT, env=env,
                       capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
