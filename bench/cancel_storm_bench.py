#!/usr/bin/python3
"""A cancel storm beside greedy clients, through scripts/run.

Starts the split deployment (scripts/run --detach), records the solo output of
4 greedy prompts, then per run: --cancels sampled streams, 16 at a time, each
cancelled right after its first token, while 4 greedy clients repeat their
requests until the storm is over. Counts, per run, the greedy requests that
failed and those whose token ids differ from the solo run (a lossless
violation), and the storm's own outcomes. Nothing here asserts: it prints
numbers and writes JSON with --json (run it under bench/record.py, which adds
the command, commit, date and machine).

usage: bench/cancel_storm_bench.py [--build build] [--runs 3] [--cancels 300] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import lede_client  # noqa: E402  (stub generation)

PROMPTS = ["Once upon a time, there was a little girl named Lily.", "The dog ran to the park and",
           "def add(a, b):\n", "Tom and his mom went to the store to buy"]


def generate(stub, pb, prompt, method, max_new, temperature=0.0, seed=0, cancel_after_first=False):
    """(status name, token ids) of one streamed call."""
    import grpc
    req = pb.GenerateRequest(prompt=prompt, max_new_tokens=max_new, method=method, temperature=temperature,
                             top_p=1.0, seed=seed)
    if method == pb.SPECULATION_METHOD_STATIC:
        req.speculation.exit_layer, req.speculation.draft_length = 2, 3
    call = stub.Generate(req, timeout=120)
    ids = []
    try:
        for resp in call:
            if resp.HasField("delta"):
                ids.extend(resp.delta.token_ids)
                if cancel_after_first:
                    call.cancel()
                    return "CANCELLED_BY_CLIENT", ids
        return "OK", ids
    except grpc.RpcError as e:
        if cancel_after_first and e.code() == grpc.StatusCode.CANCELLED:
            return "CANCELLED_BY_CLIENT", ids
        return e.code().name, ids


def one_run(target, pb, pb_grpc, solo, cancels):
    import grpc
    methods = [pb.SPECULATION_METHOD_LEDE, pb.SPECULATION_METHOD_STATIC, pb.SPECULATION_METHOD_LEDE,
               pb.SPECULATION_METHOD_AUTOREGRESSIVE]
    storm_done = threading.Event()
    lock = threading.Lock()
    greedy = {"requests": 0, "failed": 0, "differ": 0, "errors": []}
    storm = {"started": 0, "cancelled": 0, "other": {}}
    next_i = [0]

    def storm_worker():
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(target))
        while True:
            with lock:
                if next_i[0] >= cancels:
                    return
                i = next_i[0]
                next_i[0] += 1
                storm["started"] += 1
            status, _ = generate(stub, pb, PROMPTS[i % 4], methods[i % 2], 128, temperature=1.0, seed=i,
                                 cancel_after_first=True)
            with lock:
                if status == "CANCELLED_BY_CLIENT":
                    storm["cancelled"] += 1
                else:
                    storm["other"][status] = storm["other"].get(status, 0) + 1

    def greedy_worker(v):
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(target))
        while not storm_done.is_set():
            status, ids = generate(stub, pb, PROMPTS[v], methods[v], 24)
            with lock:
                greedy["requests"] += 1
                if status != "OK":
                    greedy["failed"] += 1
                    greedy["errors"].append(status)
                elif ids != solo[v]:
                    greedy["differ"] += 1

    stormers = [threading.Thread(target=storm_worker) for _ in range(16)]
    victims = [threading.Thread(target=greedy_worker, args=(v,)) for v in range(4)]
    for t in stormers + victims:
        t.start()
    for t in stormers:
        t.join()
    storm_done.set()
    for t in victims:
        t.join()
    return {"greedy": greedy, "storm": storm}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cancels", type=int, default=300)
    ap.add_argument("--ports-base", type=int, default=3300)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    import grpc
    import tempfile
    pb, pb_grpc = lede_client.load_stubs()
    state = tempfile.mkdtemp(prefix="lede-storm-bench-")
    env = {**os.environ, "LEDE_BUILD_DIR": a.build}
    run = os.path.join(ROOT, "scripts", "run")
    subprocess.run([run, "--detach", "--ports-base", str(a.ports_base), "--state-dir", state], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    target = f"127.0.0.1:{50051 + a.ports_base}"
    try:
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(target))
        methods = [pb.SPECULATION_METHOD_LEDE, pb.SPECULATION_METHOD_STATIC, pb.SPECULATION_METHOD_LEDE,
                   pb.SPECULATION_METHOD_AUTOREGRESSIVE]
        solo = []
        for v in range(4):
            status, ids = generate(stub, pb, PROMPTS[v], methods[v], 24)
            if status != "OK":
                raise SystemExit(f"solo run {v} failed: {status}")
            solo.append(ids)
        runs = []
        for r in range(a.runs):
            res = one_run(target, pb, pb_grpc, solo, a.cancels)
            runs.append(res)
            g, s = res["greedy"], res["storm"]
            print(f"run {r + 1}: greedy {g['requests']} requests, {g['failed']} failed, {g['differ']} differ from "
                  f"solo; storm {s['started']} streams, {s['cancelled']} cancelled after their first token, "
                  f"other outcomes {s['other']}")
    finally:
        subprocess.run([run, "--stop", "--state-dir", state], env=env, stdout=subprocess.DEVNULL)
    if a.json:
        result = {
            "benchmark": "cancel_storm",
            "cancels_per_run": a.cancels, "runs": runs,
        }
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
