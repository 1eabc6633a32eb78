#!/usr/bin/python3
"""Tokens/s through the services vs the in-process engine.

Runs the same prompts (greedy, fixed length) four ways and prints decode
tokens/s side by side:
  in-process   `lede generate` (drafter and verifier in one address space, no RPC)
  split        coordinator + verifier + drafter processes on a shared-memory KV pool
  co-located   coordinator + one `lede-model --role both` process
  remote       split, with the drafter asking the policy service once per decision
for the LEDE policy and for autoregressive decoding. Decode tokens/s excludes
the prefill (time to first token), as in the engine's stats; the services'
figure is the coordinator's own measurement over its RPCs; "client" is the
wall clock seen by the Python client per request, prefill and stream included.
Nothing here asserts: it prints numbers (and writes JSON with --json).

usage: bench/services_bench.py [--build build] [--model DIR] [--weights FORMAT] [--threads N] [--policy DIR]
                               [--deployments split,...]
                               [--prompts N] [--new-tokens T] [--json FILE]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import lede_client  # noqa: E402  (stub generation)

MODEL = os.path.join(ROOT, "models", "lede-tiny")
PROMPTS = os.path.join(ROOT, "models", "lede-tiny", "prompts")  # story.jsonl, code.jsonl
WEIGHTS = []  # ["--weights", FORMAT] for lede-model and lede generate, or none (the checkpoint's own)
POLICY = None  # policy root or version directory; None: MODEL/policy
THREADS = 1  # --threads of every engine, in process and in the services


def started_ports(log_path):
    m = re.search(r"event=started grpc_port=(\d+) metrics_port=(\d+)", open(log_path).read())
    return (int(m.group(1)), int(m.group(2))) if m else None


def decide_calls(metrics_port):
    """Policy.Decide calls the policy service has answered (its lede_requests_total)."""
    import urllib.request
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("lede_requests_total{") and 'method="Decide"' in line)


def start(args, log_path):
    log = open(log_path, "w")
    # As scripts/run starts the services: libtorch's idle OpenMP threads sleep.
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        if p.poll() is not None:
            raise RuntimeError("%s exited:\n%s" % (args[0], open(log_path).read()[-2000:]))
        ports = started_ports(log_path)
        if ports:
            return p, ports[0]
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("%s did not start:\n%s" % (args[0], open(log_path).read()[-2000:]))


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def deploy(kind, build, tmp, model_args=(), coordinator_args=()):
    """Starts a deployment (model_args, coordinator_args: extra lede-model and lede-coordinator
    flags); returns (processes, coordinator port)."""
    model_bin = os.path.join(build, "services", "model", "lede-model")
    coord_bin = os.path.join(build, "services", "coordinator", "lede-coordinator")
    policy_bin = os.path.join(build, "services", "policy", "lede-policy")
    common = (["--model", MODEL, "--metrics", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--threads", str(THREADS)]
              + WEIGHTS + list(model_args))
    procs = []
    pool = "/lede-kv-bench-%d-%s" % (os.getpid(), kind)
    policy = POLICY or os.path.join(MODEL, "policy")
    policy_dir = ["--policy-dir", policy]
    if kind == "remote":
        p, policy_port = start([policy_bin, "--policy-root", policy,
                                "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
                               os.path.join(tmp, "policy.log"))
        procs.append(p)
        policy_dir = ["--policy", "127.0.0.1:%d" % policy_port, "--remote-decisions"]
    if kind == "co-located":
        p, vport = start([model_bin, "--role", "both"] + common + policy_dir, os.path.join(tmp, kind + "-model.log"))
        procs.append(p)
        dport = vport
    else:
        p, vport = start([model_bin, "--role", "verifier", "--kv-pool", pool] + common,
                         os.path.join(tmp, kind + "-verifier.log"))
        procs.append(p)
        p, dport = start([model_bin, "--role", "drafter", "--kv-pool", pool] + common + policy_dir,
                         os.path.join(tmp, kind + "-drafter.log"))
        procs.append(p)
    # --http "": no OpenAI HTTP API, whose fixed port would collide with a running server.
    p, cport = start([coord_bin, "--model", MODEL, "--verifier", "127.0.0.1:%d" % vport,
                      "--drafter", "127.0.0.1:%d" % dport, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                      "--http", ""] + list(coordinator_args),
                     os.path.join(tmp, kind + "-coordinator.log"))
    procs.append(p)
    return procs, cport


def run_services(port, prompts, method, new_tokens, pb, pb_grpc):
    import grpc
    totals = {"tokens": 0, "decode_s": 0.0, "client_s": 0.0, "accepted": 0, "drafted": 0, "outputs": []}
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        stub = pb_grpc.GenerationStub(channel)
        for prompt in prompts:
            req = pb.GenerateRequest(prompt=prompt, max_new_tokens=new_tokens,
                                     method=getattr(pb, "SPECULATION_METHOD_" + method.upper()))
            for r in stub.Generate(req, timeout=120):  # a warm-up pass, as in-process
                pass
            t0 = time.perf_counter()
            ids, summary = [], None
            for r in stub.Generate(req, timeout=120):
                if r.HasField("delta"):
                    ids.extend(r.delta.token_ids)
                else:
                    summary = r.summary
            totals["client_s"] += time.perf_counter() - t0
            n = summary.generated_tokens
            if n > 1 and summary.decode_tokens_per_second > 0:
                totals["tokens"] += n - 1
                totals["decode_s"] += (n - 1) / summary.decode_tokens_per_second
            totals["accepted"] += summary.accepted_tokens
            totals["drafted"] += summary.drafted_tokens
            totals["outputs"].append(ids)
    return totals


def run_in_process(build, prompts, method, new_tokens):
    lede = os.path.join(build, "services", "cli", "lede")
    mode = {"lede": "lede", "autoregressive": "ar"}[method]
    totals = {"tokens": 0, "decode_s": 0.0, "client_s": 0.0}
    for prompt in prompts:
        out = subprocess.run([lede, "generate", "--model", MODEL, "--prompt", prompt, "--mode", mode,
                              "--max-new-tokens", str(new_tokens), "--threads", str(THREADS), "--repeat", "2"] + WEIGHTS
                             + (["--policy", POLICY] if POLICY and method == "lede" else []),
                             capture_output=True, text=True, cwd=ROOT, check=True)
        # the second (warm) run, as the services' measured pass below
        last = re.findall(r"\] (\d+) tokens, ([\d.]+) tokens/s.*wall ([\d.]+) s", out.stderr)[-1]
        n, tps, wall = int(last[0]), float(last[1]), float(last[2])
        if n > 1 and tps > 0:
            totals["tokens"] += n - 1
            totals["decode_s"] += (n - 1) / tps
        totals["client_s"] += wall
    return totals


def main():
    global MODEL, WEIGHTS, POLICY, THREADS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("LEDE_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--prompts", type=int, default=12, help="story prompts (and as many code prompts)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "lede-tiny"), help="model directory (its policy/ serves; default lede-tiny)")
    ap.add_argument("--weights", help="weight format for every engine (f32, bf16, q8_0, ...; default: the file's)")
    ap.add_argument("--deployments", default="split,co-located,remote")
    ap.add_argument("--threads", type=int, default=1, help="--threads of every engine (in process and services)")
    ap.add_argument("--policy", help="policy root or version directory (default: MODEL/policy; remote: a root)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    MODEL = os.path.abspath(a.model)
    WEIGHTS = ["--weights", a.weights] if a.weights else []
    POLICY = os.path.abspath(a.policy) if a.policy else None
    THREADS = a.threads
    kinds = a.deployments.split(",")
    pb, pb_grpc = lede_client.load_stubs()
    prompts = []
    for name in ("story.jsonl", "code.jsonl"):
        with open(os.path.join(PROMPTS, name)) as f:
            prompts += [json.loads(line)["prompt"] for line in f][-a.prompts:]  # the evaluation half
    results = {}
    methods = ["lede", "autoregressive"]
    for m in methods:
        results[("in-process", m)] = run_in_process(a.build, prompts, m, a.new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            procs, port = deploy(kind, a.build, tmp)
            try:
                for m in methods:
                    if kind == "remote" and m != "lede":
                        continue
                    before = decide_calls(started_ports(os.path.join(tmp, "policy.log"))[1]) if kind == "remote" else 0
                    results[(kind, m)] = run_services(port, prompts, m, a.new_tokens, pb, pb_grpc)
                    if kind == "remote":
                        # the measured pass only (run_services also makes a warm-up pass per prompt)
                        calls = decide_calls(started_ports(os.path.join(tmp, "policy.log"))[1]) - before
                        results[(kind, m)]["decide_calls"] = calls / 2
            finally:
                stop(procs)
    def same_outputs(k1, k2, ms):
        if any((k1, m) not in results or (k2, m) not in results for m in ms):
            return None  # a deployment not run
        return all(results[(k1, m)]["outputs"] == results[(k2, m)]["outputs"] for m in ms)
    same = same_outputs("split", "co-located", methods)
    same_remote = same_outputs("remote", "split", ["lede"])

    print("%s%s, %d prompts x %d new tokens, greedy, %d thread(s) per engine"
          % (os.path.basename(MODEL.rstrip("/")), " " + a.weights if a.weights else "", len(prompts), a.new_tokens,
             THREADS))
    print("%-12s %-15s %12s %10s %14s %10s" % ("deployment", "method", "decode tok/s", "vs in-proc",
                                                  "client tok/s", "accept"))
    rows = []
    for (kind, m), t in results.items():
        tps = t["tokens"] / t["decode_s"] if t["decode_s"] else 0.0
        ref = results[("in-process", m)]
        ref_tps = ref["tokens"] / ref["decode_s"] if ref["decode_s"] else 0.0
        client = (t["tokens"] + len(prompts)) / t["client_s"] if t["client_s"] else 0.0
        acc = t.get("accepted", 0) / t["drafted"] if t.get("drafted") else float("nan")
        print("%-12s %-15s %12.1f %9.1f%% %14.1f %10.3f" % (kind, m, tps, 100 * tps / ref_tps if ref_tps else 0,
                                                           client, acc))
        rows.append({"deployment": kind, "method": m, "threads": THREADS, "decode_tokens_per_s": tps,
                     "ratio_to_in_process": tps / ref_tps if ref_tps else None, "client_tokens_per_s": client,
                     "acceptance_rate": None if acc != acc else acc})
    print("split and co-located emit the same tokens: %s; remote decisions emit the same tokens: %s"
          % (same, same_remote))
    remote, split = results.get(("remote", "lede"), {}), results.get(("split", "lede"), {})
    per_decision_ms = None
    if remote.get("decide_calls") and split:
        per_decision_ms = 1e3 * (remote["decode_s"] - split["decode_s"]) / remote["decide_calls"]
        print("remote decisions: %d Decide calls in the measured pass, %.3f ms each over the in-process DQN"
              % (remote["decide_calls"], per_decision_ms))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(MODEL.rstrip("/")), "weights": a.weights, "policy": a.policy,
                       "rows": rows, "same_tokens_split_colocated": same, "same_tokens_remote": same_remote,
                       "prompts": len(prompts), "new_tokens": a.new_tokens,
                       "remote_decision_overhead_ms": per_decision_ms}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
