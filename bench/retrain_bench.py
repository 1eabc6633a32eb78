#!/usr/bin/python3
"""Retraining on a deployment's own traffic, end to end.

Both runs serve a copy of models/lede-tiny without policy/ and without
calibration-cpu.json with `scripts/run --model COPY` (cold start: the
self-calibrated static policy cold-start-v1), send greedy requests through
the public gRPC API with the default method (no method field: LEDE with the
serving policy), stop the services (the coordinator flushes its request log)
and run `lede-train --once --experience <state>/experience --policy-root
<state>/policy --model COPY` with no other flags.

  acceptance  The issue's acceptance run on held-out code the project never
              saw (testdata/prompts/debian_python.jsonl, SOURCES.md): rows
              0-199 are the traffic; then a second --once with no new traffic
              must publish nothing; then `lede-bench bench` on rows 200-299
              (the first half tunes the static baseline, the second half
              evaluates) replays the published policy, the shipped code-aware
              accelerator-v7, the cold start and the best static setting under
              the accelerator cost model. Targets: published >= 1.05x best
              static and >= 0.98x accelerator-v7.
  widened     The issue's loop on the memory-bound widened model (`lede widen
              --factor 5`, its shipped policy removed: a cold start), served
              by `scripts/run` at LEDE_WEIGHTS=q8_0, LEDE_THREADS=1 (--weights,
              --threads), in wall-clock: --traffic requests (200; half greedy,
              half temperature --temperature 0.8, seeded) from the tuning halves
              of models/lede-tiny/prompts/{story,code}.jsonl (rows 0-23) and
              the output of scripts/make_policy_training_prompts.py, never the
              evaluation halves; then `lede-train --once` with no other flags;
              then --rounds deployments, each timing --eval-prompts held-out
              prompts per set (rows 24+ of both sets: the evaluation halves),
              greedy, one stream: per prompt, autoregressive decoding, then
              the default method under the cold-start policy, the retrained
              one and the shipped policy of the shape (models/lede-tiny/
              widened/<fingerprint>/policy), SERVING switched in place (order
              rotating). One deployment serves all three, so a deployment's
              own speed (process placement, the VM) cancels in the ratios;
              it did not when each policy had its own deployments. Targets:
              the retrained policy's served tok/s >= 1.05x the cold start's
              and >= 1.0x the shipped policy's, in the same deployment.
  scale       1,000 greedy requests (12-word openings of
              testdata/corpus/tinystories_val_a.txt), then the --once pinned
              to one core (taskset -c 0): its wall time, CPU time and peak
              RSS (target <= 10 minutes, bounded memory).

Prints the numbers and writes JSON (with bench/record.py's provenance) to
bench/results/retrain-acceptance.json or bench/results/retrain-scale.json.
Nothing asserts; "targets" in the JSON says which were met.

The services use the default ports (API 50051, metrics 9401..9404) when they
are free; when another deployment holds them, --ports-base N is added (and
recorded in the JSON as a deviation from "no other flag").

usage: bench/retrain_bench.py acceptance|widened|scale [--out FILE] [--work DIR] [--new-tokens 64]
                              [--concurrency N] [--requests N] [--ports-base N]
       bench/retrain_bench.py widened [--traffic 200] [--temperature 0.8] [--eval-prompts 12]
                              [--rounds 2] [--weights q8_0] [--threads 1] [--factor 5]
env: LEDE_BUILD_DIR (build)
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
BUILD = os.environ.get("LEDE_BUILD_DIR", "build")
MODEL = "models/lede-tiny"
PROMPTS = "testdata/prompts/debian_python.jsonl"
STORIES = "testdata/corpus/tinystories_val_a.txt"
SHIPPED_CODE_POLICY = "accelerator-v7"  # the shipped code-aware policy of the accelerator cost model


def log(msg):
    print(f"retrain_bench: {msg}", flush=True)


def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def pick_ports_base(asked):
    if asked is not None:
        return asked
    for base in (0, 1000, 2000, 3000, 4000):
        if all(port_free(p + base) for p in (50051, 8000, 9401, 9402, 9403, 9404)):
            return base
    sys.exit("retrain_bench: no free set of ports (tried bases 0..4000)")


def widen_model(dst, factor):
    """`lede widen --factor K` of models/lede-tiny, without policy/ and calibration-cpu.json."""
    cmd = [f"{BUILD}/services/cli/lede", "widen", "--model", MODEL, "--factor", str(factor), "--out", dst,
           "--overwrite"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    for name in ("policy", "calibration-cpu.json"):
        path = os.path.join(dst, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    return " ".join(cmd)


def copy_model(dst):
    """models/lede-tiny without policy/ and calibration-cpu.json."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(os.path.join(ROOT, MODEL), dst,
                    ignore=lambda d, names: [n for n in names if os.path.abspath(d) == os.path.abspath(
                        os.path.join(ROOT, MODEL)) and n in ("policy", "calibration-cpu.json")])
    assert not os.path.exists(os.path.join(dst, "policy"))
    assert not os.path.exists(os.path.join(dst, "calibration-cpu.json"))


class Deployment:
    """`scripts/run --model COPY` in the foreground, in the background."""

    def __init__(self, model, state, ports_base, env_extra=None):
        self.base = ports_base
        self.cmd = ["scripts/run", "--model", model] + (["--ports-base", str(ports_base)] if ports_base else [])
        env = dict(os.environ, LEDE_STATE_DIR=state, **(env_extra or {}))
        os.makedirs(state, exist_ok=True)
        self.log_path = os.path.join(os.path.dirname(state), "run.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.target = f"127.0.0.1:{50051 + ports_base}"
        ready = f"http://127.0.0.1:{9401 + ports_base}/readyz"
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"retrain_bench: scripts/run exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(ready, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        sys.exit(f"retrain_bench: the deployment was not ready in 300 s; see {self.log_path}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # scripts/run stops everything in order
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def send(target, prompts, new_tokens, concurrency, method=0, temperatures=None):
    """Requests (method 0: the default, LEDE with the serving policy), greedy
    unless temperatures[i] > 0 (then seeded with i + 1); returns per-request
    summaries (tokens, ids, seconds, policy version)."""
    import grpc
    from lede_client import load_stubs
    pb, pb_grpc = load_stubs()
    results = [None] * len(prompts)
    next_i = [0]
    lock = threading.Lock()

    def worker():
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.GenerationStub(channel)
            while True:
                with lock:
                    i = next_i[0]
                    next_i[0] += 1
                if i >= len(prompts):
                    return
                temperature = temperatures[i] if temperatures else 0.0
                req = pb.GenerateRequest(request_id=f"bench-{i}", prompt=prompts[i], max_new_tokens=new_tokens,
                                         temperature=temperature, seed=i + 1 if temperature > 0 else 0,
                                         method=method)
                ids, summary = [], None
                t0 = time.perf_counter()
                for resp in stub.Generate(req, timeout=300):
                    if resp.HasField("delta"):
                        ids.extend(resp.delta.token_ids)
                    else:
                        summary = resp.summary
                results[i] = {"tokens": len(ids), "ids": ids, "seconds": time.perf_counter() - t0,
                              "policy_version": summary.policy_version if summary else ""}

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.time() - start


def run_timed(cmd, pin_core=None):
    """Runs cmd; returns (rc, output, wall_s, cpu_s, peak_rss_mib) of that process alone."""
    full = (["taskset", "-c", str(pin_core)] if pin_core is not None else []) + cmd
    out = tempfile.TemporaryFile(mode="w+")
    start = time.time()
    proc = subprocess.Popen(full, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    text = out.read()
    return proc.returncode, text, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def once(model, state, pin_core=None):
    cmd = [f"{BUILD}/trainer/lede-train", "--once", "--experience", f"{state}/experience",
           "--policy-root", f"{state}/policy", "--model", model]
    rc, text, wall, cpu, rss = run_timed(cmd, pin_core)
    event = next((l for l in text.splitlines() if l.startswith("event=retrain ")), "")
    metrics = next((l for l in text.splitlines() if l.startswith("event=retrain_metrics")), "")
    fields = dict(kv.split("=", 1) for kv in event.split() if "=" in kv)
    serving = open(os.path.join(state, "policy", "SERVING")).read().strip()
    report = {}
    if fields.get("report", "-") != "-" and os.path.exists(fields["report"]):
        report = json.load(open(fields["report"]))
    return {"command": " ".join(cmd), "exit_status": rc, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "peak_rss_mib": round(rss, 1), "decision": fields.get("decision", "?"),
            "candidate": fields.get("candidate", "-"), "serving_after": serving, "event": event,
            "metrics": metrics, "report": report, "output_tail": text.splitlines()[-12:]}


def jsonl_prompts(path, lo, hi):
    rows = [json.loads(l) for l in open(os.path.join(ROOT, path)) if l.strip()]
    return rows[lo:hi]


def bench_rows(report):
    (name, s), = report["sets"].items()
    return {r["method"]: r for r in s["rows"]}, s


def acceptance(a, work):
    model, state = os.path.join(work, "model"), os.path.join(work, "state")
    copy_model(model)
    traffic = [r["prompt"] for r in jsonl_prompts(PROMPTS, 0, 200)]
    heldout = jsonl_prompts(PROMPTS, 200, 300)
    base = pick_ports_base(a.ports_base)
    log(f"serving {model} (scripts/run --model COPY{' --ports-base %d' % base if base else ''})")
    dep = Deployment(model, state, base)
    try:
        cold = open(os.path.join(state, "policy", "SERVING")).read().strip()
        res, send_s = send(dep.target, traffic, a.new_tokens, a.concurrency)
    finally:
        dep.stop()
    served_versions = sorted({r["policy_version"] for r in res})
    log(f"sent {len(res)} requests in {send_s:.1f} s ({sum(r['tokens'] for r in res)} tokens; served by {served_versions})")
    first = once(model, state)
    log(f"first --once: {first['decision']} {first['candidate']} in {first['wall_s']} s; SERVING {first['serving_after']}")
    second = once(model, state)
    log(f"second --once: {second['decision']} in {second['wall_s']} s; SERVING {second['serving_after']}")
    published = first["serving_after"] if first["decision"] == "published" else None

    heldout_path = os.path.join(work, "heldout.jsonl")
    with open(heldout_path, "w") as f:
        for r in heldout:
            f.write(json.dumps(r) + "\n")
    policies = [os.path.join(ROOT, MODEL, "policy", SHIPPED_CODE_POLICY), os.path.join(state, "policy", cold)]
    if published:
        policies.insert(0, os.path.join(state, "policy", published))
    bench_json = os.path.join(work, "bench.json")
    cmd = [f"{BUILD}/bench/lede-bench", "bench", "--model", model, "--prompts", heldout_path,
           "--calibration", os.path.join(ROOT, MODEL, "calibration-cpu.json"), "--candidate-layers", "1,2,3,4,5,6",
           "--max-draft-len", "6", "--prompts-per-set", str(len(heldout)), "--new-tokens", str(a.new_tokens),
           "--threads", "1", "--repeats", "1", "--methods", "ar,static,lede", "--policy", ",".join(policies),
           "--json", bench_json]
    log("replaying the held-out half: " + " ".join(cmd))
    rc, text, wall, _, _ = run_timed(cmd)
    if rc != 0:
        sys.exit(f"retrain_bench: lede-bench failed ({rc}):\n{text[-3000:]}")
    rows, s = bench_rows(json.load(open(bench_json)))
    acc = "predicted_speedup_accelerator"
    static = rows["static (best accelerator)"]
    shipped = rows[f"lede {SHIPPED_CODE_POLICY}"]
    cold_row = rows[f"lede {cold}"]
    out = {
        "benchmark": "retrain-acceptance",
        "model_copy": "models/lede-tiny without policy/ and calibration-cpu.json",
        "serve_command": "scripts/run --model COPY" + (f" --ports-base {base}" if base else ""),
        "ports_base": base,
        "prompts": {"file": PROMPTS, "traffic_rows": "0-199", "heldout_rows": "200-299",
                    "tuning_prompts": s.get("tuning_prompts"), "eval_prompts": s.get("eval_prompts")},
        "traffic": {"requests": len(res), "new_tokens": a.new_tokens, "concurrency": a.concurrency,
                    "send_s": round(send_s, 1), "tokens": sum(r["tokens"] for r in res),
                    "served_policy_versions": served_versions, "cold_start_version": cold},
        "first_once": first, "second_once": second, "published_version": published,
        "cost_model": "accelerator",
        "heldout_replay": {
            "best_static": {"config": static["config"], "speedup": static[acc]},
            "shipped_code_aware": {"version": SHIPPED_CODE_POLICY, "speedup": shipped[acc]},
            "cold_start": {"version": cold, "speedup": cold_row[acc]},
            "lede_bench_wall_s": round(wall, 1)},
    }
    if published:
        pub = rows[f"lede {published}"]
        out["heldout_replay"]["published"] = {"version": published, "speedup": pub[acc]}
        r_static, r_shipped = pub[acc] / static[acc], pub[acc] / shipped[acc]
        out["targets"] = {
            "published_over_best_static": {"value": round(r_static, 4), "target": 1.05, "met": r_static >= 1.05},
            "published_over_shipped": {"value": round(r_shipped, 4), "target": 0.98, "met": r_shipped >= 0.98},
            "second_once_publishes_nothing": {"value": second["decision"], "met": second["decision"] != "published"
                                              and second["serving_after"] == first["serving_after"]},
        }
    else:
        out["targets"] = {"published": {"value": first["decision"], "met": False}}
    out["rows"] = {k: {"config": v["config"], acc: v[acc], "acceptance_rate": v.get("acceptance_rate"),
                       "tokens_per_round": v.get("tokens_per_round")} for k, v in rows.items()}
    hr = out["heldout_replay"]
    log("held-out replay (accelerator cost model): " + ", ".join(
        f"{k} {v['speedup']:.3f}x" for k, v in hr.items() if isinstance(v, dict)))
    for k, v in out["targets"].items():
        log(f"target {k}: {v['value']} (target {v.get('target', '-')}) -> {'met' if v['met'] else 'MISSED'}")
    return out


def serve_version(target, state, version, probe_prompt, timeout_s=60):
    """Points the deployment's SERVING at version and waits until a short request reports it served
    (the policy service polls SERVING; the drafter follows it)."""
    with open(os.path.join(state, "policy", "SERVING"), "w") as f:
        f.write(version + "\n")
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        (r,), _ = send(target, [probe_prompt], 4, 1)  # 4 tokens: the first rounds draft, naming the policy
        if r["policy_version"].split("+")[0] == version:
            return
        time.sleep(0.2)
    sys.exit(f"retrain_bench: the deployment did not serve {version} within {timeout_s} s of SERVING naming it")


def timed_policies(target, state, policies, prompts, new_tokens, rnd):
    """One deployment: each prompt autoregressively, then with the default method under each policy
    (SERVING switched in place, the order rotating with the prompt and the round), one stream, greedy.
    Per method: summed tokens / summed request seconds, and how many outputs equal the autoregressive ones."""
    t = {k: [0, 0.0] for k in ["autoregressive"] + policies}
    same = {v: 0 for v in policies}
    for i, p in enumerate(prompts):
        (ar,), _ = send(target, [p], new_tokens, 1, method=4)  # SPECULATION_METHOD_AUTOREGRESSIVE
        t["autoregressive"][0] += ar["tokens"]
        t["autoregressive"][1] += ar["seconds"]
        k = (i + rnd) % len(policies)
        for version in policies[k:] + policies[:k]:
            serve_version(target, state, version, p)
            (d,), _ = send(target, [p], new_tokens, 1)
            t[version][0] += d["tokens"]
            t[version][1] += d["seconds"]
            same[version] += d["ids"] == ar["ids"]
    tok_s = {k: v[0] / v[1] for k, v in t.items()}
    return {"round": rnd, "tok_s": {k: round(v, 2) for k, v in tok_s.items()},
            "speedup": {v: round(tok_s[v] / tok_s["autoregressive"], 4) for v in policies},
            "lossless": {v: f"{same[v]}/{len(prompts)}" for v in policies}}


def prompt_rows(path, lo, hi):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return [json.loads(l)["prompt"] for l in f if l.strip()][lo:hi]


def interleave(*lists):
    out = []
    for i in range(max(len(l) for l in lists)):
        out.extend(l[i] for l in lists if i < len(l))
    return out


# The evaluation halves of models/lede-tiny's prompt sets start here (trainer/corpus.cc: the first
# half of a set's 48 prompts tunes, the second evaluates).
TUNING_ROWS = 24


def widened_prompts(a, work):
    """The traffic (tuning halves, then the policy-training prompts, story and code interleaved)
    and the held-out prompts (evaluation halves)."""
    train_dir = os.path.join(work, "train-prompts")
    subprocess.run([sys.executable, "scripts/make_policy_training_prompts.py", train_dir], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    sets = {name: f"{MODEL}/prompts/{name}.jsonl" for name in ("story", "code")}
    tuning = interleave(*(prompt_rows(p, 0, TUNING_ROWS) for p in sets.values()))
    extra = interleave(*(prompt_rows(os.path.join(train_dir, f"train-{n}.jsonl"), 0, None) for n in sets))
    traffic = (tuning + extra)[:a.traffic]
    if len(traffic) < a.traffic:
        sys.exit(f"retrain_bench: only {len(traffic)} traffic prompts for --traffic {a.traffic}")
    heldout = interleave(*(prompt_rows(p, TUNING_ROWS, TUNING_ROWS + a.eval_prompts) for p in sets.values()))
    desc = {"traffic": f"rows 0-{TUNING_ROWS - 1} of {', '.join(sets.values())} (the tuning halves), then "
                       "scripts/make_policy_training_prompts.py's train-story.jsonl and train-code.jsonl, "
                       "story and code interleaved",
            "traffic_from_tuning_halves": min(len(tuning), a.traffic),
            "heldout": f"rows {TUNING_ROWS}-{TUNING_ROWS + a.eval_prompts - 1} of each set (the evaluation halves)"}
    return traffic, heldout, desc


def install_shipped(state, fingerprint):
    """The shape's shipped SERVING version, copied into the deployment's policy root."""
    root = os.path.join(ROOT, MODEL, "widened", fingerprint, "policy")
    version = open(os.path.join(root, "SERVING")).read().strip()
    dst = os.path.join(state, "policy", version)
    if not os.path.exists(dst):
        shutil.copytree(os.path.join(root, version), dst)
    return version


def ratio_stats(runs, x, y):
    """x's default-method tok/s over y's in the same deployment (the same processes, prompts interleaved),
    per round: median, min, max, and the ratios in ascending order (per_round)."""
    v = sorted(r["tok_s"][x] / r["tok_s"][y] for r in runs)
    return {"median": round(median(v), 4), "min": round(v[0], 4), "max": round(v[-1], 4),
            "per_round": [round(r, 4) for r in v]}


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def widened(a, work):
    model, state = os.path.join(work, "model"), os.path.join(work, "state")
    widen_cmd = widen_model(model, a.factor)
    traffic, heldout, prompt_desc = widened_prompts(a, work)
    temps = [a.temperature if i % 2 else 0.0 for i in range(len(traffic))]
    env = {"LEDE_WEIGHTS": a.weights, "LEDE_THREADS": str(a.threads)}
    base = pick_ports_base(a.ports_base)
    log(f"serving {model} ({widen_cmd}, policy removed; scripts/run --model COPY, {env})")
    t0 = time.time()
    dep = Deployment(model, state, base, env)
    start_s = time.time() - t0
    try:
        cold = open(os.path.join(state, "policy", "SERVING")).read().strip()
        cold_meta = json.load(open(os.path.join(state, "policy", cold, "policy.json")))
        res, send_s = send(dep.target, traffic, a.new_tokens, a.concurrency, temperatures=temps)
    finally:
        dep.stop()
    log(f"cold start {cold} ({cold_meta.get('training_options')}); sent {len(res)} requests in {send_s:.1f} s")
    first = once(model, state)
    log(f"--once: {first['decision']} {first['candidate']} in {first['wall_s']} s; SERVING {first['serving_after']}")
    published = first["serving_after"] if first["decision"] == "published" else None
    shipped = install_shipped(state, cold_meta["model_fingerprint"])
    policies = [v for v in (cold, published, shipped) if v]
    runs = []
    for rnd in range(a.rounds):
        dep = Deployment(model, state, base, env)
        try:
            send(dep.target, heldout[:1], 8, 1)  # warm-up: the first request pays for allocation
            send(dep.target, heldout[:1], 8, 1, method=4)
            r = timed_policies(dep.target, state, policies, heldout, a.new_tokens, rnd)
        finally:
            dep.stop()
        runs.append(r)
        log(f"deployment {rnd + 1}: tok/s {r['tok_s']}, speed-up {r['speedup']}, same text {r['lossless']}")
    with open(os.path.join(state, "policy", "SERVING"), "w") as f:
        f.write((published or cold) + "\n")

    out = {
        "benchmark": "retrain-widened",
        "model_copy": f"{widen_cmd}, without policy/ and calibration-cpu.json",
        "serve_command": "scripts/run --model COPY" + (f" --ports-base {base}" if base else ""),
        "serve_env": env, "ports_base": base, "start_s": round(start_s, 1),
        "prompts": prompt_desc,
        "traffic": {"requests": len(res), "greedy": temps.count(0.0), "sampled": len(temps) - temps.count(0.0),
                    "temperature": a.temperature, "new_tokens": a.new_tokens, "concurrency": a.concurrency,
                    "send_s": round(send_s, 1), "tokens": sum(r["tokens"] for r in res),
                    "served_policy_versions": sorted({r["policy_version"] for r in res}),
                    "cold_start_version": cold, "cold_start": cold_meta.get("training_options"),
                    "cold_start_offline_metrics": cold_meta.get("offline_metrics")},
        "once": first, "published_version": published, "shipped_version": shipped,
        "heldout": {"prompts": len(heldout), "new_tokens": a.new_tokens, "rounds": a.rounds},
        "served": runs,
        "median_speedup": {v: round(median([r["speedup"][v] for r in runs]), 4) for v in policies},
        "note": "one deployment per round; per held-out prompt, autoregressive decoding, then the default method "
                "(LEDE with the serving policy) under each policy, SERVING switched in place and confirmed by the "
                "served policy version, the order rotating per prompt and round; one stream, greedy. speed-up = "
                "a policy's tokens/s / autoregressive tokens/s in the same deployment; ratios = one policy's "
                "tokens/s over another's in the same deployment",
    }
    if published:
        out["ratios"] = {f"{published} / {cold}": ratio_stats(runs, published, cold),
                         f"{published} / {shipped}": ratio_stats(runs, published, shipped),
                         f"{shipped} / {cold}": ratio_stats(runs, shipped, cold)}
        over_cold = out["ratios"][f"{published} / {cold}"]["median"]
        over_shipped = out["ratios"][f"{published} / {shipped}"]["median"]
        out["targets"] = {
            "retrained_over_cold_start": {"value": over_cold, "target": 1.05, "met": over_cold >= 1.05},
            "retrained_over_shipped": {"value": over_shipped, "target": 1.0, "met": over_shipped >= 1.0}}
    else:
        out["ratios"] = {f"{shipped} / {cold}": ratio_stats(runs, shipped, cold)}
        out["targets"] = {"published": {"value": first["decision"], "met": False}}
    for k, v in out["ratios"].items():
        log(f"{k}: tok/s ratio {v['median']:.3f}x [{v['min']:.3f}, {v['max']:.3f}]")
    for k, v in out["targets"].items():
        log(f"target {k}: {v['value']} (target {v.get('target', '-')}) -> {'met' if v['met'] else 'MISSED'}")
    return out


def story_openings(n):
    text = open(os.path.join(ROOT, STORIES), encoding="utf-8").read()
    out = []
    for para in text.split("\n"):
        words = para.split()
        if len(words) >= 24:
            out.append(" ".join(words[:12]))
        if len(out) == n:
            break
    if len(out) < n:
        sys.exit(f"retrain_bench: only {len(out)} story openings in {STORIES}")
    return out


def scale(a, work):
    model, state = os.path.join(work, "model"), os.path.join(work, "state")
    copy_model(model)
    prompts = story_openings(a.requests)
    base = pick_ports_base(a.ports_base)
    dep = Deployment(model, state, base)
    try:
        res, send_s = send(dep.target, prompts, a.new_tokens, a.concurrency)
    finally:
        dep.stop()
    log(f"sent {len(res)} requests in {send_s:.1f} s ({sum(r['tokens'] for r in res)} tokens)")
    first = once(model, state, pin_core=0)
    log(f"--once on one core: {first['decision']} in {first['wall_s']:.1f} s wall, {first['cpu_s']:.1f} s CPU, "
        f"peak RSS {first['peak_rss_mib']:.0f} MiB")
    rep = first["report"]
    return {
        "benchmark": "retrain-scale",
        "model_copy": "models/lede-tiny without policy/ and calibration-cpu.json",
        "ports_base": base,
        "traffic": {"requests": len(res), "prompts": f"12-word openings of {STORIES}", "new_tokens": a.new_tokens,
                    "concurrency": a.concurrency, "send_s": round(send_s, 1),
                    "tokens": sum(r["tokens"] for r in res)},
        "once": first,
        "one_core": "taskset -c 0",
        "wall_s": first["wall_s"], "cpu_s": first["cpu_s"], "peak_rss_mib": first["peak_rss_mib"],
        "requests_trained_and_evaluated": rep.get("requests"),
        "targets": {"wall_s_at_most_600": {"value": first["wall_s"], "target": 600, "met": first["wall_s"] <= 600}},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", choices=["acceptance", "widened", "scale"])
    p.add_argument("--out", default="")
    p.add_argument("--work", default="")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=0, help="client threads (default 1 acceptance, 4 scale)")
    p.add_argument("--requests", type=int, default=1000, help="scale: requests sent")
    p.add_argument("--ports-base", type=int, default=None)
    p.add_argument("--factor", type=int, default=5, help="widened: lede widen --factor")
    p.add_argument("--eval-prompts", type=int, default=12,
                   help="widened: held-out prompts per set (story, code) timed per deployment")
    p.add_argument("--rounds", type=int, default=2, help="widened: deployments, each timing every policy")
    p.add_argument("--traffic", type=int, default=200, help="widened: served requests before --once")
    p.add_argument("--temperature", type=float, default=0.8, help="widened: every other traffic request's")
    p.add_argument("--weights", default="q8_0", help="widened: LEDE_WEIGHTS of the deployments")
    p.add_argument("--threads", type=int, default=1, help="widened: LEDE_THREADS of the deployments")
    a = p.parse_args()
    if a.new_tokens < 1 or a.requests < 1 or a.concurrency < 0:
        sys.exit("retrain_bench: --new-tokens and --requests must be >= 1, --concurrency >= 0")
    if a.traffic < 1 or a.rounds < 1 or a.threads < 1 or not 1 <= a.eval_prompts <= TUNING_ROWS or a.temperature < 0:
        sys.exit(f"retrain_bench: --traffic, --rounds and --threads must be >= 1, --eval-prompts in [1, {TUNING_ROWS}], "
                 "--temperature >= 0")
    a.concurrency = a.concurrency or (4 if a.run == "scale" else 1)
    for b in ("trainer/lede-train", "trainer/lede-init-policy", "bench/lede-bench", "services/model/lede-model",
              "services/policy/lede-policy", "services/coordinator/lede-coordinator"):
        if not os.access(os.path.join(ROOT, BUILD, b), os.X_OK):
            sys.exit(f"retrain_bench: {BUILD}/{b} is missing; build it first")
    work = os.path.abspath(a.work or os.path.join(ROOT, "out", f"retrain-{a.run}"))
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    result = {"acceptance": acceptance, "widened": widened, "scale": scale}[a.run](a, work)
    out = a.out or os.path.join(ROOT, "bench", "results", f"retrain-{a.run}.json")
    raw = os.path.join(work, "result.json")
    with open(raw, "w") as f:
        json.dump(result, f, indent=2)
    command = "bench/retrain_bench.py " + " ".join(sys.argv[1:])
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "record.py"), out, "--from", raw,
                    "--command", command], cwd=ROOT, check=True)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
