#!/usr/bin/python3
"""Slow and idle HTTP clients against the OpenAI API.

Starts the split deployment with scripts/run --detach, opens N slow
connections to the OpenAI HTTP port (each sends the start of a request, then
one more header line every --trickle-s seconds and never finishes its
headers; a connection the server cuts is reopened, so N stay open), then
sends --requests normal completions one after another and prints each one's
latency, beside the coordinator's thread and descriptor counts (from /proc)
before and while the slow clients are held. Nothing here asserts: it prints
numbers and writes JSON with --json (run it under bench/record.py, which adds
the command, commit, date and machine).

usage: bench/hostile_clients_bench.py [--build build] [--slow 200] [--trickle-s 2]
                                      [--hold-s 30] [--requests 10] [--json FILE]
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

    def __init__(self, port, n, trickle_s):
        self.port, self.n, self.trickle_s = port, n, trickle_s
        self.stop = threading.Event()
        self.cut = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\n")
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--trickle-s", type=float, default=2.0)
    ap.add_argument("--hold-s", type=float, default=30.0)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--ports-base", type=int, default=3100)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    state = tempfile.mkdtemp(prefix="lede-hostile-bench-")
    env = {**os.environ, "LEDE_BUILD_DIR": a.build}
    run = os.path.join(ROOT, "scripts", "run")
    subprocess.run([run, "--detach", "--ports-base", str(a.ports_base), "--state-dir", state], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    http = 8000 + a.ports_base
    try:
        pids = dict(line.split() for line in open(os.path.join(state, "pids")) if len(line.split()) == 2)
        coord = int(pids["coordinator"])
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
    finally:
        subprocess.run([run, "--stop", "--state-dir", state], env=env, stdout=subprocess.DEVNULL)
    result = {
        "benchmark": "hostile_clients",
        "slow_connections": a.slow, "trickle_s": a.trickle_s, "hold_s": a.hold_s,
        "statuses": statuses, "latency_s": [round(x, 4) for x in latencies],
        "latency_max_s": round(max(latencies), 4),
        "slow_connections_cut_and_reopened": slow.cut,
        "coordinator_threads": {"before": before[0], "max_during": max(d[0] for d in during), "after": after[0]},
        "coordinator_fds": {"before": before[1], "max_during": max(d[1] for d in during), "after": after[1]},
    }
    print(f"{a.slow} slow connections (a header line every {a.trickle_s} s), {a.requests} completions:")
    print("  status  " + " ".join(str(s) for s in statuses))
    print("  latency " + " ".join(f"{x:.3f}" for x in latencies) + f" s (max {max(latencies):.3f})")
    print(f"  slow connections cut by the request deadline and reopened: {slow.cut}")
    print(f"  coordinator threads: {before[0]} before, max {result['coordinator_threads']['max_during']} "
          f"during, {after[0]} after; descriptors: {before[1]}, max {result['coordinator_fds']['max_during']}, "
          f"{after[1]}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
