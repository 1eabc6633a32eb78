#!/usr/bin/python3
"""Hostile clients against a scripts/run deployment (docs/security.md).

Three scenarios, chosen with --scenario (default: all):

- api-slow: N slow connections to the OpenAI HTTP port (each sends the start
  of a request, then one more header line every --trickle-s seconds and never
  finishes its headers; a connection the server cuts is reopened, so N stay
  open), then --requests normal completions one after another, each one's
  latency printed beside the coordinator's thread and descriptor counts.
- metrics-slow: N slow connections on the metrics port of every process
  (coordinator, verifier, drafter, policy service) for --hold-s, while
  /healthz and /metrics of every process are probed every 0.5 s; prints the
  slowest answer and the probes that got none (or no 200) within 5 s, and how
  many slow connections the servers closed.
- burst: --burst concurrent /v1/completions (one thread each, all released
  at once): the count of each HTTP status (with the JSON error's code), of
  connection resets and of other failures, and of non-200 answers that are
  not a JSON error; then the
  coordinator's thread count every second for --settle-s seconds, against its
  idle count before the burst.

Nothing here asserts: it prints numbers and writes JSON with --json (run it
under bench/record.py, which adds the command, commit, date and machine).

usage: bench/hostile_clients_bench.py [--build build] [--scenario all|api-slow|metrics-slow|burst]
                                      [--slow 200] [--trickle-s 2] [--hold-s 30] [--requests 10]
                                      [--burst 300] [--settle-s 30] [--json FILE]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def proc_counts(pid):
    """(threads, open descriptors) of a process."""
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def completion(port, timeout=30):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            status = r.status
    except Exception as e:  # noqa: BLE001 (a benchmark reports, it does not stop)
        status = getattr(e, "code", 0)
    return status, time.monotonic() - t0


class SlowClients:
    """N connections that never finish their headers; reopened when cut."""

    def __init__(self, port, n, trickle_s, start=b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\n"):
        self.port, self.n, self.trickle_s, self.start = port, n, trickle_s, start
        self.stop = threading.Event()
        self.cut = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(self.start)
        return s

    def run(self):
        socks = []
        for _ in range(self.n):
            try:
                socks.append(self.open_one())
            except OSError:
                socks.append(None)
        while not self.stop.wait(self.trickle_s):
            for i, s in enumerate(socks):
                try:
                    if s is None:
                        raise OSError("reopen")
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    self.cut += 1
                    try:
                        if s is not None:
                            s.close()
                        socks[i] = self.open_one()
                    except OSError:
                        socks[i] = None
        for s in socks:
            if s is not None:
                s.close()


def probe(port, path, timeout=5.0):
    """(HTTP status or 0 for no answer, seconds) of one GET."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except Exception:  # noqa: BLE001 (a benchmark reports, it does not stop)
        status = 0
    return status, time.monotonic() - t0


def api_slow(a, http, coord):
    completion(http)  # warm-up
    before = proc_counts(coord)
    slow = SlowClients(http, a.slow, a.trickle_s)
    slow.thread.start()
    time.sleep(min(5.0, a.hold_s))
    latencies, statuses, during = [], [], []
    t_end = time.monotonic() + a.hold_s
    for _ in range(a.requests):
        status, dt = completion(http)
        statuses.append(status)
        latencies.append(dt)
        during.append(proc_counts(coord))
    while time.monotonic() < t_end:
        during.append(proc_counts(coord))
        time.sleep(1)
    slow.stop.set()
    slow.thread.join()
    after = proc_counts(coord)
    result = {
        "slow_connections": a.slow, "trickle_s": a.trickle_s, "hold_s": a.hold_s,
        "statuses": statuses, "latency_s": [round(x, 4) for x in latencies],
        "latency_max_s": round(max(latencies), 4),
        "slow_connections_cut_and_reopened": slow.cut,
        "coordinator_threads": {"before": before[0], "max_during": max(d[0] for d in during), "after": after[0]},
        "coordinator_fds": {"before": before[1], "max_during": max(d[1] for d in during), "after": after[1]},
    }
    print(f"api-slow: {a.slow} slow connections (a header line every {a.trickle_s} s), {a.requests} completions:")
    print("  status  " + " ".join(str(s) for s in statuses))
    print("  latency " + " ".join(f"{x:.3f}" for x in latencies) + f" s (max {max(latencies):.3f})")
    print(f"  slow connections cut by the request deadline and reopened: {slow.cut}")
    print(f"  coordinator threads: {before[0]} before, max {result['coordinator_threads']['max_during']} "
          f"during, {after[0]} after; descriptors: {before[1]}, max {result['coordinator_fds']['max_during']}, "
          f"{after[1]}")
    return result


def metrics_slow(a, metrics_ports):
    slows = {name: SlowClients(port, a.slow, a.trickle_s, b"GET /metrics HTTP/1.1\r\nHost: bench\r\n")
             for name, port in metrics_ports.items()}
    for s in slows.values():
        s.thread.start()
    time.sleep(1.0)
    worst = {f"{n} {p}": 0.0 for n in metrics_ports for p in ("/healthz", "/metrics")}
    failed = {k: 0 for k in worst}
    probes = 0
    t_end = time.monotonic() + a.hold_s
    while time.monotonic() < t_end:
        for name, port in metrics_ports.items():
            for path in ("/healthz", "/metrics"):
                status, dt = probe(port, path)
                key = f"{name} {path}"
                worst[key] = max(worst[key], dt)
                failed[key] += status != 200
        probes += 1
        time.sleep(0.5)
    for s in slows.values():
        s.stop.set()
    for s in slows.values():
        s.thread.join()
    result = {
        "slow_connections_per_port": a.slow, "trickle_s": a.trickle_s, "hold_s": a.hold_s,
        "probe_rounds": probes, "latency_max_s": {k: round(v, 4) for k, v in worst.items()},
        "probes_without_200": failed,
        "slow_connections_cut_and_reopened": {n: s.cut for n, s in slows.items()},
    }
    print(f"metrics-slow: {a.slow} slow connections on each metrics port for {a.hold_s} s, "
          f"{probes} probe rounds:")
    for k in worst:
        print(f"  {k:28s} slowest {worst[k]:.3f} s, without 200: {failed[k]}")
    print("  slow connections closed by the servers (and reopened): " +
          ", ".join(f"{n} {s.cut}" for n, s in slows.items()))
    return result


def burst(a, http, coord):
    completion(http)  # warm-up
    time.sleep(2.0)
    idle = proc_counts(coord)[0]
    go = threading.Event()
    outcomes = [None] * a.burst
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}).encode()

    def one(i):
        go.wait()
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()
                outcomes[i] = (r.status, True)
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                err = json.loads(text)["error"]
                outcomes[i] = (f"{e.code} {err.get('code') or err.get('type')}", True)
            except (ValueError, KeyError, TypeError, AttributeError):
                outcomes[i] = (e.code, False)
        except (ConnectionResetError, BrokenPipeError):
            outcomes[i] = ("reset", False)
        except urllib.error.URLError as e:
            reset = isinstance(e.reason, (ConnectionResetError, BrokenPipeError))
            outcomes[i] = ("reset" if reset else f"error: {e.reason}", False)
        except Exception as e:  # noqa: BLE001
            outcomes[i] = (f"error: {type(e).__name__}: {e}", False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(a.burst)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    go.set()
    peak = idle
    while any(t.is_alive() for t in threads):
        peak = max(peak, proc_counts(coord)[0])
        time.sleep(0.2)
    burst_s = time.monotonic() - t0
    for t in threads:
        t.join()
    counts = {}
    for status, _ in outcomes:
        counts[str(status)] = counts.get(str(status), 0) + 1
    non_json = sum(1 for status, ok in outcomes if isinstance(status, int) and status != 200 and not ok)
    settle = []
    back_after = None
    for sec in range(int(a.settle_s) + 1):
        n = proc_counts(coord)[0]
        settle.append(n)
        if back_after is None and n <= 2 * idle:
            back_after = sec
        time.sleep(1)
    result = {
        "burst": a.burst, "duration_s": round(burst_s, 2), "statuses": counts,
        "resets": counts.get("reset", 0), "non_200_without_json_error": non_json,
        "coordinator_threads": {"idle_before": idle, "peak": max(peak, max(settle)), "each_second_after": settle,
                                "within_2x_idle_after_s": back_after},
    }
    print(f"burst: {a.burst} concurrent completions in {burst_s:.1f} s: " +
          ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f"; non-200 without a JSON error: {non_json}")
    print(f"  coordinator threads: {idle} idle before, peak {result['coordinator_threads']['peak']}, "
          f"then each second: {' '.join(str(x) for x in settle)}")
    print(f"  back within 2x idle ({2 * idle}) after: "
          f"{'never in ' + str(a.settle_s) + ' s' if back_after is None else str(back_after) + ' s'}")
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--scenario", default="all", choices=["all", "api-slow", "metrics-slow", "burst"])
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--trickle-s", type=float, default=2.0)
    ap.add_argument("--hold-s", type=float, default=30.0)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--burst", type=int, default=300)
    ap.add_argument("--settle-s", type=float, default=30.0)
    ap.add_argument("--ports-base", type=int, default=3100)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    state = tempfile.mkdtemp(prefix="lede-hostile-bench-")
    env = {**os.environ, "LEDE_BUILD_DIR": a.build}
    run = os.path.join(ROOT, "scripts", "run")
    subprocess.run([run, "--detach", "--ports-base", str(a.ports_base), "--state-dir", state], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    http = 8000 + a.ports_base
    metrics_ports = {"coordinator": 9401 + a.ports_base, "verifier": 9402 + a.ports_base,
                     "policy": 9403 + a.ports_base, "drafter": 9404 + a.ports_base}
    result = {"benchmark": "hostile_clients"}
    try:
        pids = dict(line.split() for line in open(os.path.join(state, "pids")) if len(line.split()) == 2)
        coord = int(pids["coordinator"])
        if a.scenario in ("all", "api-slow"):
            result.update(api_slow(a, http, coord))  # top level: the docs table reads these keys
        if a.scenario in ("all", "metrics-slow"):
            result["metrics_slow"] = metrics_slow(a, metrics_ports)
        if a.scenario in ("all", "burst"):
            result["burst"] = burst(a, http, coord)
    finally:
        subprocess.run([run, "--stop", "--state-dir", state], env=env, stdout=subprocess.DEVNULL)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
