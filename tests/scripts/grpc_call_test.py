#!/usr/bin/python3
"""Integration test of scripts/grpc_call.py against a real lede-policy.

usage: tests/scripts/grpc_call_test.py PATH/TO/lede-policy

Starts lede-policy on ephemeral ports (models/lede-tiny/policy), then runs
list, describe, a unary call, a bad call and server-streaming calls through the
script, which sees the server only through its reflection service.
"""
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "grpc_call.py")
FAILURES = []


def check(cond, what, detail=""):
    print("%s %s%s" % ("ok  " if cond else "FAIL", what, (": " + detail) if not cond and detail else ""))
    if not cond:
        FAILURES.append(what)


def start_server(binary):
    proc = subprocess.Popen(
        [binary, "--policy-root", os.path.join(ROOT, "models", "lede-tiny", "policy"),
         "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()

    def drain():  # keeps reading so the server never blocks on a full pipe
        for line in proc.stderr:
            lines.put(line)
    threading.Thread(target=drain, daemon=True).start()
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        m = re.search(r"event=started grpc_port=(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    proc.wait()
    raise RuntimeError("lede-policy did not start (exit %s)" % proc.returncode)


def run(addr, cmd, opts=(), timeout=30):
    """Runs grpc_call.py [opts] addr cmd...; returns (rc, stdout, stderr)."""
    r = subprocess.run([sys.executable, SCRIPT] + list(opts) + [addr] + list(cmd),
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    proc, port = start_server(sys.argv[1])
    addr = "127.0.0.1:%d" % port
    try:
        rc, out, err = run(addr, ["list"])
        services = out.split()
        check(rc == 0 and "lede.v1.Policy" in services and "grpc.health.v1.Health" in services,
              "list", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["describe", "lede.v1.Policy"])
        check(rc == 0 and "service lede.v1.Policy {" in out
              and "rpc Decide(lede.v1.DecideRequest) returns (lede.v1.DecideResponse);" in out
              and "returns (stream lede.v1.PolicyVersion)" in out,
              "describe service", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["describe", "lede.v1.DecideResponse"])
        check(rc == 0 and "repeated lede.v1.ExitAction actions = 1;" in out,
              "describe message", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["call", "lede.v1.Policy/Decide",
                                  '{"states":[{"features":[0,0.25,0,0.9,0.1,0.1,0.2,0.5,0.9,0.6,0,1,1,0,0.02,0.5,0.3,0.4]}]}'])
        lines = out.splitlines()
        resp = json.loads(lines[0]) if rc == 0 and len(lines) == 1 else {}
        check(isinstance(resp.get("actions"), list) and len(resp["actions"]) == 1 and resp.get("version"),
              "call unary Decide", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["call", "lede.v1.Policy/Decide", '{"no_such_field": 1}'])
        check(rc == 1 and out == "" and err.startswith("INVALID_ARGUMENT:") and "no_such_field" in err
              and "Traceback" not in err, "bad field -> clean error", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["call", "lede.v1.Policy/Decide", '{"states":[{"features":[1]}]}'])
        check(rc == 1 and err.startswith("INVALID_ARGUMENT:") and "Traceback" not in err,
              "server error -> code: message", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["call", "lede.v1.Policy/NoSuchMethod", "{}"])
        check(rc == 1 and err.startswith("NOT_FOUND:") and "Traceback" not in err,
              "unknown method", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["call", "lede.v1.Policy/WatchPolicy", "{}"], opts=["--max-messages", "1"])
        lines = out.splitlines()
        check(rc == 0 and len(lines) == 1 and json.loads(lines[0]).get("version"),
              "server streaming, --max-messages 1", "rc=%d out=%r err=%r" % (rc, out, err))

        # Without --max-messages the stream stays open: the deadline ends it after the first message.
        rc, out, err = run(addr, ["call", "lede.v1.Policy/WatchPolicy", "{}"], opts=["--timeout", "2"])
        lines = out.splitlines()
        check(rc == 1 and len(lines) >= 1 and json.loads(lines[0]).get("version")
              and err.startswith("DEADLINE_EXCEEDED:"),
              "server streaming until the deadline", "rc=%d out=%r err=%r" % (rc, out, err))

        rc, out, err = run(addr, ["call", "grpc.health.v1.Health/Check", "{}"])
        check(rc == 0 and json.loads(out or "{}").get("status") == "SERVING",
              "health check", "rc=%d out=%r err=%r" % (rc, out, err))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
