#!/usr/bin/python3
"""lede-train's metrics as a user sees them (trainer/retrain_metrics.h).

  watch     `lede-train --watch --metrics 127.0.0.1:0` serves /metrics and
            /healthz; lede_retrain_runs_total{decision="no_new_data"} grows
            with each run (an empty store), and SIGTERM stops it with status 0
  once      `--once --metrics-textfile F` prints the logfmt line and writes the
            text exposition; a bad --metrics address is refused (status 2)
  locked    while another process holds <policy-root>/retrain.lock,
            `--once` exits with status 75 and one line naming the holder,
            having written nothing; once the lock is free it runs (status 0)

usage: train_metrics_test.py watch|once|locked BUILD_DIR
Exit status 0 = pass, 1 = fail.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def setup():
    """A policy root serving the model's shipped serving policy (its SERVING pointer) and an empty store."""
    tmp = tempfile.mkdtemp(prefix="lede-train-metrics-")
    root = os.path.join(tmp, "policy")
    os.makedirs(root)
    shipped_root = os.path.join(ROOT, "models", "lede-tiny", "policy")
    with open(os.path.join(shipped_root, "SERVING")) as f:
        version = f.read().strip()
    shutil.copytree(os.path.join(shipped_root, version), os.path.join(root, version))
    with open(os.path.join(root, "SERVING"), "w") as f:
        f.write(version + "\n")
    store = os.path.join(tmp, "experience")
    os.makedirs(store)
    return tmp, root, store


def runs(text, decision):
    m = re.search(r'^lede_retrain_runs_total\{decision="%s"\} (\S+)$' % decision, text, re.M)
    return float(m.group(1)) if m else None


def test_watch(build):
    tmp, root, store = setup()
    cmd = [os.path.join(build, "trainer", "lede-train"), "--watch", "--interval-s", "0.2", "--metrics",
           "127.0.0.1:0", "--experience", store, "--policy-root", root]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.time() + 60
        while url is None and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                fail(f"lede-train --watch exited ({proc.wait()}) before serving metrics")
            m = re.search(r"url=(http://\S+/metrics)", line)
            url = m.group(1) if m else None
        if url is None:
            fail("no 'serving metrics' line")
        seen = []
        while time.time() < deadline:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            n = runs(text, "no_new_data")
            if n is None:
                fail("no lede_retrain_runs_total{decision=\"no_new_data\"} series:\n" + text)
            seen.append(n)
            if n >= 2:
                break
            time.sleep(0.1)
        if not seen or seen[-1] < 2:
            fail(f"the no_new_data counter did not move: {seen}")
        if runs(text, "published") != 0 or runs(text, "failed") != 0:
            fail("runs with nothing new were counted as published or failed:\n" + text)
        with urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=5) as r:
            if r.status != 200:
                fail(f"/healthz: {r.status}")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        if rc != 0:
            fail(f"lede-train --watch exited with {rc} on SIGTERM")
        print(f"no_new_data runs seen: {seen}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_once(build):
    tmp, root, store = setup()
    try:
        textfile = os.path.join(tmp, "retrain.prom")
        base = [os.path.join(build, "trainer", "lede-train"), "--experience", store, "--policy-root", root]
        r = subprocess.run(base + ["--once", "--metrics-textfile", textfile], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            fail(f"--once: {r.returncode}\n{r.stdout}{r.stderr}")
        line = next((l for l in r.stdout.splitlines() if l.startswith("event=retrain_metrics ")), None)
        if line is None or "runs_no_new_data=1" not in line or "runs_published=0" not in line:
            fail("no logfmt metrics line with the run:\n" + r.stdout)
        with open(textfile) as f:
            text = f.read()
        if runs(text, "no_new_data") != 1:
            fail("the textfile does not count the run:\n" + text)
        bad = subprocess.run(base + ["--watch", "--metrics", "127.0.0.1:99999"], capture_output=True, text=True,
                             timeout=60)
        if bad.returncode != 2 or "--metrics" not in bad.stderr:
            fail(f"a bad --metrics address: status {bad.returncode}, stderr {bad.stderr!r}")
        print(line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_locked(build):
    import fcntl
    tmp, root, store = setup()
    try:
        cmd = [os.path.join(build, "trainer", "lede-train"), "--once", "--experience", store, "--policy-root", root]
        with open(os.path.join(root, "retrain.lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another retraining, as far as lede-train knows
            lock.truncate(0)
            lock.write(f"pid={os.getpid()} since=test\n")
            lock.flush()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if r.returncode != 75:
                fail(f"--once while the root is locked: status {r.returncode}, not 75\n{r.stdout}{r.stderr}")
            lines = [l for l in r.stderr.splitlines() if "being retrained by another process" in l]
            if len(lines) != 1 or f"pid={os.getpid()}" not in lines[0] or root not in lines[0]:
                fail(f"no one line naming the root and the holder:\n{r.stderr}")
            if os.path.exists(os.path.join(root, "retrain_state.json")):
                fail("the refused run wrote the state checkpoint")
            if "runs_locked=1" not in r.stdout:
                fail("the refused run is not counted as locked:\n" + r.stdout)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # the lock is free again
        if r.returncode != 0:
            fail(f"--once after the lock was released: status {r.returncode}\n{r.stdout}{r.stderr}")
        print(lines[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    cases = {"watch": test_watch, "once": test_once, "locked": test_locked}
    if len(argv) != 3 or argv[1] not in cases:
        print(__doc__)
        return 2
    cases[argv[1]](argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
