#!/usr/bin/python3
"""Serving benchmark over the public gRPC API, in the convention of `vllm bench serve`.

For each deployment (split: coordinator + verifier + drafter processes on a
shared-memory KV pool; co-located: coordinator + one `lede-model --role both`),
each method (LEDE, static, autoregressive) and each client concurrency N, N
client threads send requests back to back (a closed loop, as `--max-concurrency`
in vLLM's benchmark) until --num-prompts requests are done, and it prints:
  request throughput (req/s), output tokens/s (all generated tokens / wall),
  TTFT (send -> first token), TPOT ((end - first token) / (tokens - 1)),
  ITL (gaps between streamed chunks; a speculation round streams its tokens
  together, so ITL is per chunk, as vLLM's is per SSE event), mean / p50 / p99,
  the acceptance rate, mean exit layer and draft length (from the summaries),
  and the RSS and open file descriptors of every process after the warm-up and
  at the end (a leak shows as growth at a flat load; --soak-s runs one level
  that long and samples them every --sample-s).
Prompts: --prompt-file (repeatable; JSON lines with "prompt" or "turns"),
default the shipped model's story prompts and testdata/prompts/humaneval.jsonl.
The model services run with --slots (default 16) and the verifier's queue holds
the rest, so concurrency above the slot count measures queueing too.
--max-batch 1,16 runs each deployment once per value: the verifier batches up
to that many sessions' prefill chunks and verifications per step (continuous
batching; 1 = one sequence per pass on each handler thread).
With --check-solo N it also sends, per deployment and method, N requests one at
a time and then all N at once (N above --slots queues the rest), and reports how
many completed and how many equal their solo runs token for token.
Nothing here asserts: it prints numbers (and writes JSON with --json).

With --replicas 1,2,3 it instead deploys that many co-located replicas behind
one coordinator (--replicas) and prints aggregate and per-replica tokens/s at
one concurrency (on this machine the replicas share its cores).

usage: bench/serve_bench.py [--concurrency 1,4,16,64] [--num-prompts 32] [--new-tokens 64]
                            [--methods lede,static,autoregressive] [--deployments split,co-located]
                            [--slots 16] [--max-batch 16] [--static-config 2,3] [--soak-s 0]
                            [--speculation-max-load 0]
                            [--replicas 1,2,3] [--check-solo 24]
                            [--json FILE]
"""
import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lede_client  # noqa: E402  (stub generation)
import services_bench  # noqa: E402  (process launch)


def load_prompts(files):
    """The prompts of every file, interleaved (one of each file in turn)."""
    per_file = []
    for path in files:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        per_file.append([t[:2000] for t in (r.get("prompt") or (r.get("turns") or [None])[0] for r in rows) if t])
    prompts = [p for group in zip(*per_file) for p in group] if per_file else []
    if not prompts:
        raise SystemExit("no prompts in " + ", ".join(files))
    return prompts


def fitting_prompts(port, pb, pb_grpc, prompts, new_tokens):
    """The prompts the server accepts with new_tokens to generate: one that cannot fit the context
    window with them is INVALID_ARGUMENT before any token (as vLLM's benchmark drops prompts that
    exceed the model's length, counting such a refusal as a failed request would measure the
    prompt set, not the server). Each stream is cancelled at its first message: a prefill each."""
    import grpc
    keep = []
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        stub = pb_grpc.GenerationStub(channel)
        for prompt in prompts:
            call = stub.Generate(pb.GenerateRequest(prompt=prompt, max_new_tokens=new_tokens), timeout=60)
            try:
                next(call)
                keep.append(prompt)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
            finally:
                call.cancel()
    return keep


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def proc_usage(pids):
    """{pid: (rss MiB, open fds)} from /proc."""
    out = {}
    for pid in pids:
        try:
            with open("/proc/%d/status" % pid) as f:
                rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024.0
            out[pid] = (rss, len(os.listdir("/proc/%d/fd" % pid)))
        except (OSError, StopIteration):
            out[pid] = (float("nan"), -1)
    return out


def proc_role(pid):
    """A short name for a service process: its --role, or the binary's name."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().decode().split("\0")
    except OSError:
        return str(pid)
    if "--role" in argv:
        return argv[argv.index("--role") + 1]
    return os.path.basename(argv[0]).replace("lede-", "")


def cpu_seconds(pids):
    """{role: user + system CPU seconds so far} of the service processes and of this client."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[proc_role(pid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            out[proc_role(pid)] = float("nan")
    t = os.times()
    out["client"] = t.user + t.system
    return out


class Request:
    def __init__(self):
        self.ok = False
        self.code = None
        self.ttft = None
        self.end = None
        self.chunk_times = []
        self.n_tokens = 0
        self.summary = None
        self.ids = []


def one_request(stub, pb, prompt, method, new_tokens, static_config):
    req = pb.GenerateRequest(prompt=prompt, max_new_tokens=new_tokens,
                             method=getattr(pb, "SPECULATION_METHOD_" + method.upper()))
    if method == "static":
        req.speculation.exit_layer, req.speculation.draft_length = static_config
    r = Request()
    t0 = time.perf_counter()
    try:
        for resp in stub.Generate(req, timeout=600):
            now = time.perf_counter() - t0
            if resp.HasField("delta"):
                if r.ttft is None:
                    r.ttft = now
                r.chunk_times.append(now)
                r.n_tokens += len(resp.delta.token_ids)
                r.ids.extend(resp.delta.token_ids)
            else:
                r.summary = resp.summary
        r.ok = True
    except Exception as e:  # grpc.RpcError
        r.code = getattr(e, "code", lambda: None)()
    r.end = time.perf_counter() - t0
    return r


def print_log_problems(log_dir, last=40):
    """The last `last` warning, error and request_failed lines of the deployment logs in log_dir
    (services_bench.deploy)."""
    lines = []
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".log"):
            with open(os.path.join(log_dir, name), errors="replace") as f:
                lines += [name + ": " + l.rstrip() for l in f
                          if any(k in l for k in ("level=warn", "level=error", "event=request_failed"))]
    print("    log warnings and errors (last %d of %d):" % (min(last, len(lines)), len(lines)))
    for l in lines[-last:]:
        print("      " + l[:400])


def solo_check(port, pb, pb_grpc, prompts, method, n, new_tokens, static_config):
    """n requests (prompt i % len) one at a time, then all n at once (those beyond the slots queue in the
    verifier): how many completed, and how many streamed exactly the token ids of their solo run (greedy
    decoding is lossless: batching must not change a token)."""
    import grpc
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        stub = pb_grpc.GenerationStub(channel)
        solo = [one_request(stub, pb, prompts[i % len(prompts)], method, new_tokens, static_config)
                for i in range(n)]
        loaded = [None] * n

        def client(i):
            loaded[i] = one_request(stub, pb, prompts[i % len(prompts)], method, new_tokens, static_config)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    equal = [i for i in range(n) if solo[i].ok and loaded[i].ok and solo[i].ids == loaded[i].ids]
    return {"method": method, "requests": n, "completed": sum(1 for r in loaded if r.ok),
            "solo_completed": sum(1 for r in solo if r.ok), "equal_to_solo": len(equal),
            "differ": [i for i in range(n) if i not in equal],
            # the gRPC status of each request that failed, solo or at once (none expected)
            "solo_failed": {str(i): str(r.code) for i, r in enumerate(solo) if not r.ok},
            "failed": {str(i): str(r.code) for i, r in enumerate(loaded) if not r.ok},
            "tokens": sum(len(r.ids) for r in loaded if r.ok)}


BATCH_HISTOGRAMS = {"verifier": "lede_iteration_batch_size", "drafter": "lede_draft_batch_size"}


def batch_metrics(metrics_ports):
    """(sum, count) of each service's batch-size histogram, {name: (sum, count)}, from its /metrics."""
    import urllib.request
    out = {}
    for service, port in metrics_ports.items():
        hist = BATCH_HISTOGRAMS[service]
        try:
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
        except OSError:
            continue
        values = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith(hist + "_sum") or line.startswith(hist + "_count")}
        out[service] = (values.get(hist + "_sum", 0.0), values.get(hist + "_count", 0.0))
    return out


def deployment_metrics_ports(kind, tmp):
    """The metrics ports of a deployment's verifier and drafter (one process for both when co-located)."""
    logs = {"verifier": kind + "-model.log", "drafter": kind + "-model.log"} if kind == "co-located" else \
        {"verifier": kind + "-verifier.log", "drafter": kind + "-drafter.log"}
    ports = {}
    for service, log in logs.items():
        found = services_bench.started_ports(os.path.join(tmp, log))
        if found:
            ports[service] = found[1]
    return ports


def run_level(port, pb, pb_grpc, prompts, method, concurrency, num_requests, new_tokens, static_config,
              soak_s=0.0, sample=None, pids=(), metrics_ports=None):
    import grpc
    results, lock = [], threading.Lock()
    next_index = [0]
    stop_at = time.perf_counter() + soak_s if soak_s else None

    def client():
        with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
            stub = pb_grpc.GenerationStub(channel)
            while True:
                with lock:
                    i = next_index[0]
                    if (stop_at is None and i >= num_requests) or (stop_at and time.perf_counter() > stop_at):
                        return
                    next_index[0] += 1
                r = one_request(stub, pb, prompts[i % len(prompts)], method, new_tokens, static_config)
                with lock:
                    results.append(r)

    cpu0 = cpu_seconds(pids)
    batch0 = batch_metrics(metrics_ports or {})
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    while sample and any(t.is_alive() for t in threads):
        time.sleep(sample[0])
        sample[1]()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = cpu_seconds(pids)
    batch1 = batch_metrics(metrics_ports or {})
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [(r.end - r.ttft) / (r.n_tokens - 1) for r in ok if r.ttft is not None and r.n_tokens > 1]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    drafted = sum(r.summary.drafted_tokens for r in ok if r.summary)
    accepted = sum(r.summary.accepted_tokens for r in ok if r.summary)
    rounds = [r.summary for r in ok if r.summary and r.summary.drafted_tokens > 0]
    weights = sum(s.rounds for s in rounds) or 1
    tokens = sum(r.n_tokens for r in ok)
    prompt_tokens = sum(r.summary.prompt_tokens for r in ok if r.summary)

    def stats(xs):
        return {"mean_ms": 1e3 * statistics.fmean(xs) if xs else float("nan"),
                "p50_ms": 1e3 * percentile(xs, 50), "p99_ms": 1e3 * percentile(xs, 99)}

    return {
        "method": method, "concurrency": concurrency, "requests": len(results), "completed": len(ok),
        "failed": {str(c): sum(1 for r in results if not r.ok and r.code == c)
                   for c in set(r.code for r in results if not r.ok)},
        "wall_s": wall, "request_throughput": len(ok) / wall, "output_tokens_per_s": tokens / wall,
        "output_tokens": tokens, "prompt_tokens": prompt_tokens,
        "ttft": stats(ttft), "tpot": stats(tpot), "itl": stats(itl),
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_exit_layer": sum(s.mean_exit_layer * s.rounds for s in rounds) / weights if rounds else None,
        "mean_draft_length": sum(s.mean_draft_length * s.rounds for s in rounds) / weights if rounds else None,
        # CPU seconds each process spent on this level, per output token (us) and in all (cores busy).
        "cpu_us_per_token": {k: 1e6 * (cpu1[k] - cpu0[k]) / max(1, tokens) for k in cpu1},
        "cores_busy": sum(cpu1[k] - cpu0[k] for k in cpu1) / wall,
        # Mean sessions per batched step of the verifier and of the drafter on this level.
        "sessions_per_step": {k: (batch1[k][0] - batch0[k][0]) / (batch1[k][1] - batch0[k][1])
                              for k in batch1 if k in batch0 and batch1[k][1] > batch0[k][1]},
    }


def deploy_replicas(n, build, tmp, model_args):
    """n co-located model processes behind one coordinator (--replicas)."""
    model_bin = os.path.join(build, "services", "model", "lede-model")
    coord_bin = os.path.join(build, "services", "coordinator", "lede-coordinator")
    procs, targets = [], []
    for i in range(n):
        p, port = services_bench.start(
            [model_bin, "--role", "both", "--model", services_bench.MODEL, "--listen", "127.0.0.1:0",
             "--metrics", "127.0.0.1:0", "--policy-dir", os.path.join(services_bench.MODEL, "policy")]
            + list(model_args), os.path.join(tmp, "replica-%d-%d.log" % (n, i)))
        procs.append(p)
        targets.append("127.0.0.1:%d" % port)
    p, cport = services_bench.start(
        [coord_bin, "--model", services_bench.MODEL, "--replicas", ",".join(targets), "--listen", "127.0.0.1:0",
         "--metrics", "127.0.0.1:0"], os.path.join(tmp, "coordinator-replicas-%d.log" % n))
    procs.append(p)
    return procs, cport


def fmt(x, spec="%.1f"):
    return "-" if x is None or x != x else spec % x


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("LEDE_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--num-prompts", type=int, default=32, help="requests per (method, concurrency) level")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--methods", default="lede,static,autoregressive")
    ap.add_argument("--deployments", default="split,co-located")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--max-batch", default="16", help="verifier --max-batch values, e.g. 1,16 (one run each)")
    ap.add_argument("--batch-threads", type=int, default=1, help="verifier --batch-threads")
    ap.add_argument("--batch-workers", type=int, default=2, help="verifier --batch-workers")
    ap.add_argument("--batch-wait-fraction", type=float, help="verifier --batch-wait-fraction (default: its own)")
    ap.add_argument("--batch-split-rows", type=int, help="verifier --batch-split-rows (default: its own)")
    ap.add_argument("--max-batch-tokens", type=int, help="verifier --max-batch-tokens (default: its own)")
    ap.add_argument("--check-solo", type=int, default=0,
                    help="also send this many requests at once per method (e.g. 24 on 16 slots) and compare each "
                         "one's tokens with its solo run on the same deployment")
    ap.add_argument("--static-config", default="2,3", help="exit layer, draft length of the static method")
    ap.add_argument("--speculation-max-load", type=int, default=0,
                    help="coordinator --speculation-max-load (0 = no limit)")
    ap.add_argument("--prompt-file", action="append")
    ap.add_argument("--soak-s", type=float, default=0, help="instead: one level (first method, largest N) this long")
    ap.add_argument("--sample-s", type=float, default=30)
    ap.add_argument("--replicas", help="instead: co-located replicas behind one coordinator, e.g. 1,2,3 "
                                        "(first method, largest concurrency)")
    ap.add_argument("--model", default=services_bench.MODEL,
                    help="the served model directory (with a policy/ root; e.g. a `lede widen` output after "
                         "`lede-init-policy`)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    # SIGTERM (kill, a CI timeout) unwinds through the `finally` blocks that stop the deployments,
    # so no lede-model or coordinator outlives the benchmark holding its ports and KV pool.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    services_bench.MODEL = os.path.abspath(a.model)  # read by every deployment at launch
    files = a.prompt_file or [os.path.join(services_bench.MODEL, "prompts", "story.jsonl"),
                              os.path.join(ROOT, "testdata", "prompts", "humaneval.jsonl")]
    prompts = load_prompts([f for f in files if os.path.exists(f)])
    levels = [int(x) for x in a.concurrency.split(",")]
    methods = a.methods.split(",")
    static_config = tuple(int(x) for x in a.static_config.split(","))
    pb, pb_grpc = lede_client.load_stubs()
    rows, usage = [], {}
    print("%s, %d prompts, %d new tokens, greedy, --slots %d, 1 thread per process; static E=%d D=%d"
          % (os.path.basename(services_bench.MODEL.rstrip("/")), len(prompts), a.new_tokens, a.slots, static_config[0], static_config[1]))
    if a.replicas:
        return run_replicas(a, pb, pb_grpc, prompts, methods[0], max(levels), static_config)
    fitted = False
    solo_checks = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, max_batch in [(k, int(b)) for k in a.deployments.split(",") for b in a.max_batch.split(",")]:
            procs, port = services_bench.deploy(kind, a.build, tmp, ["--slots", str(a.slots), "--max-batch",
                                                                     str(max_batch), "--batch-threads",
                                                                     str(a.batch_threads), "--batch-workers",
                                                                     str(a.batch_workers)] +
                                                    (["--batch-wait-fraction", str(a.batch_wait_fraction)]
                                                     if a.batch_wait_fraction is not None else []) +
                                                    (["--batch-split-rows", str(a.batch_split_rows)]
                                                     if a.batch_split_rows is not None else []) +
                                                    (["--max-batch-tokens", str(a.max_batch_tokens)]
                                                     if a.max_batch_tokens is not None else []),
                                                ["--speculation-max-load", str(a.speculation_max_load)])
            pids = [p.pid for p in procs]
            metrics_ports = deployment_metrics_ports(kind, tmp)
            try:
                if not fitted:
                    n = len(prompts)
                    prompts[:] = fitting_prompts(port, pb, pb_grpc, prompts, a.new_tokens)
                    fitted = True
                    print("%d of %d prompts fit the context window with %d new tokens (the rest are left out)"
                          % (len(prompts), n, a.new_tokens))
                # Warm-up: one request per method, then the baseline of memory and descriptors.
                for m in methods:
                    run_level(port, pb, pb_grpc, prompts, m, 1, 1, a.new_tokens, static_config)
                usage[(kind + " B=%d" % max_batch, "warm")] = proc_usage(pids)
                if a.soak_s:
                    samples = []

                    def sample():
                        samples.append((time.time(), proc_usage(pids)))
                        print("  soak t=%.0fs " % (samples[-1][0] - samples[0][0]) + "  ".join(
                            "pid %d rss %.1f MiB fds %d" % (pid, u[0], u[1]) for pid, u in samples[-1][1].items()))
                    row = run_level(port, pb, pb_grpc, prompts, methods[0], max(levels), 0, a.new_tokens,
                                    static_config, soak_s=a.soak_s, sample=(a.sample_s, sample))
                    row["deployment"] = kind
                    row["max_batch"] = max_batch
                    row["soak_samples"] = [{"t": t, "usage": {str(k): v for k, v in u.items()}} for t, u in samples]
                    rows.append(row)
                else:
                    for m in methods:
                        for n in levels:
                            row = run_level(port, pb, pb_grpc, prompts, m, n, a.num_prompts, a.new_tokens,
                                            static_config, pids=pids, metrics_ports=metrics_ports)
                            row["deployment"] = kind
                            row["max_batch"] = max_batch
                            # per row, so that merged runs (bench/record.py -- A -- B) tell their settings apart
                            row["batch_threads"], row["batch_workers"] = a.batch_threads, a.batch_workers
                            rows.append(row)
                            print("  %-10s B=%-3d %-14s N=%-3d %6.2f req/s %7.1f tok/s TTFT %s ms TPOT %s ms"
                                  % (kind, max_batch, m, n, row["request_throughput"], row["output_tokens_per_s"],
                                     fmt(row["ttft"]["mean_ms"]), fmt(row["tpot"]["mean_ms"])), flush=True)
                            print("    CPU us/token: " + "  ".join("%s %.0f" % kv for kv in
                                                                   row["cpu_us_per_token"].items())
                                  + "  (cores busy %.2f)" % row["cores_busy"]
                                  + "".join("  %s sessions/step %.2f" % kv for kv in
                                            row["sessions_per_step"].items()), flush=True)
                if a.check_solo:
                    for m in methods:
                        check = solo_check(port, pb, pb_grpc, prompts, m, a.check_solo, a.new_tokens, static_config)
                        check["deployment"] = kind
                        check["max_batch"] = max_batch
                        solo_checks.append(check)
                        print("  %-10s B=%-3d %-14s %d concurrent requests on %d slots: %d completed, %d equal their "
                              "solo runs" % (kind, max_batch, m, check["requests"], a.slots, check["completed"],
                                             check["equal_to_solo"])
                              + "".join("; %s failed: %s" % (k, check[k]) for k in ("solo_failed", "failed")
                                        if check[k]), flush=True)
                usage[(kind + " B=%d" % max_batch, "end")] = proc_usage(pids)
            finally:
                services_bench.stop(procs)
                # A failed request leaves its evidence: the deployment's warnings and errors (its logs go with tmp).
                if any(r["failed"] for r in rows if r["max_batch"] == max_batch and r["deployment"] == kind) or any(
                        c["solo_failed"] or c["failed"] for c in solo_checks
                        if c["max_batch"] == max_batch and c["deployment"] == kind):
                    print_log_problems(tmp)
    print()
    print("%-10s %5s %-14s %4s %5s %7s %8s | %8s %8s %8s | %7s %7s | %7s %7s %7s | %6s %5s %5s"
          % ("deploy", "batch", "method", "N", "done", "req/s", "tok/s", "TTFT ms", "p50", "p99", "TPOT ms", "p99",
             "ITL ms", "p50", "p99", "accept", "exit", "draft"))
    for r in rows:
        print("%-10s %5d %-14s %4d %5d %7.2f %8.1f | %8s %8s %8s | %7s %7s | %7s %7s %7s | %6s %5s %5s"
              % (r["deployment"], r["max_batch"], r["method"], r["concurrency"], r["completed"], r["request_throughput"],
                 r["output_tokens_per_s"], fmt(r["ttft"]["mean_ms"]), fmt(r["ttft"]["p50_ms"]),
                 fmt(r["ttft"]["p99_ms"]), fmt(r["tpot"]["mean_ms"], "%.2f"), fmt(r["tpot"]["p99_ms"], "%.2f"),
                 fmt(r["itl"]["mean_ms"], "%.2f"), fmt(r["itl"]["p50_ms"], "%.2f"), fmt(r["itl"]["p99_ms"], "%.2f"),
                 fmt(r["acceptance_rate"], "%.3f"), fmt(r["mean_exit_layer"], "%.2f"),
                 fmt(r["mean_draft_length"], "%.2f")))
        if r["failed"]:
            print("    failed: %s" % r["failed"])
    print()
    for (kind, when), u in usage.items():
        print("%-10s %-5s " % (kind, when) + "  ".join("pid %d: %.1f MiB, %d fds" % (p, x[0], x[1])
                                                      for p, x in u.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "prompts": len(prompts), "new_tokens": a.new_tokens, "slots": a.slots,
                       "max_batch": a.max_batch, "num_prompts": a.num_prompts,
                       # verifier batching flags given here (null: the verifier's default)
                       "batch_split_rows": a.batch_split_rows, "max_batch_tokens": a.max_batch_tokens,
                       "static_config": static_config,
                       "solo_checks": solo_checks,
                       "usage": {"%s/%s" % k: {str(p): x for p, x in u.items()} for k, u in usage.items()}},
                      f, indent=1)
    return 0


def run_replicas(a, pb, pb_grpc, prompts, method, concurrency, static_config):
    """Aggregate tokens/s over 1, 2, 3... replicas at one client concurrency."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in a.replicas.split(",")]:
            procs, port = deploy_replicas(n, a.build, tmp, ["--slots", str(a.slots)])
            try:
                run_level(port, pb, pb_grpc, prompts, method, 1, n, a.new_tokens, static_config)  # warm-up
                row = run_level(port, pb, pb_grpc, prompts, method, concurrency, a.num_prompts, a.new_tokens,
                                static_config)
                row["replicas"] = n
                rows.append(row)
            finally:
                services_bench.stop(procs)
    base = rows[0]["output_tokens_per_s"] / rows[0]["replicas"] if rows else 0
    print("%s, N=%d clients, %d requests per layout; replicas share this machine's %d cores"
          % (method, concurrency, a.num_prompts, os.cpu_count()))
    print("%8s %8s %9s %12s %15s %9s %9s" % ("replicas", "req/s", "tok/s", "tok/s/rep", "vs 1 replica/rep",
                                              "TTFT ms", "TPOT ms"))
    for r in rows:
        per = r["output_tokens_per_s"] / r["replicas"]
        print("%8d %8.2f %9.1f %12.1f %14.2fx %9s %9s" % (r["replicas"], r["request_throughput"],
                                                       r["output_tokens_per_s"], per, per / base if base else 0,
                                                       fmt(r["ttft"]["mean_ms"]), fmt(r["tpot"]["mean_ms"], "%.2f")))
        if r["failed"]:
            print("    failed: %s" % r["failed"])
    print("the coordinator's cost of choosing a replica per request: build/bench/lede_replica_bench")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"replica_rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
