#!/usr/bin/python3
"""lede-train-counterfactual's sampled training requests as a user runs them
(trainer/counterfactual_main.cc --temperature, --top-p, --seeds).

  bad      a negative --temperature, --top-p outside (0, 1], --seeds other
           than 1 when greedy, or --also-greedy when greedy is refused with
           status 2 and a message naming the flag, having written no policy
  sampled  --temperature 0.8 --seeds 2 on lede-tiny traces every prompt
           twice (both seeds on the prompt's side of the training/selection
           split), and the policy records the sampling it was trained under;
           with --also-greedy, three times (its greedy trace too)

usage: counterfactual_cli_test.py bad|sampled BUILD_DIR
Exit status 0 = pass, 1 = fail.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODEL = os.path.join(ROOT, "models", "lede-tiny")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def train(build, out, *extra):
    """Runs a short training (8 prompts of the story set: 4 tuning) and returns the process."""
    cmd = [os.path.join(build, "trainer", "lede-train-counterfactual"), "--model", MODEL,
           "--prompts", os.path.join(MODEL, "prompts", "story.jsonl"), "--prompts-per-set", "8",
           "--new-tokens", "12", "--iterations", "1", "--epochs", "1", "--candidate-layers", "1,2,3",
           "--threads", "1", "--out", out, "--version", "t", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def case_bad(build, tmp):
    for flags, name in ((["--temperature", "-1"], "--temperature"), (["--temperature", "0.8", "--top-p", "0"], "--top-p"),
                        (["--seeds", "2"], "--seeds"), (["--temperature", "0.8", "--seeds", "0"], "--seeds"),
                        (["--also-greedy"], "--also-greedy")):
        out = os.path.join(tmp, "policy-" + name.strip("-"))
        p = train(build, out, *flags)
        if p.returncode != 2:
            fail(f"{flags}: status {p.returncode}, want 2\n{p.stderr[-2000:]}")
        if name not in p.stderr:
            fail(f"{flags}: the message does not name {name}: {p.stderr[-500:]}")
        if os.path.exists(os.path.join(out, "policy.json")):
            fail(f"{flags}: a policy was written")


def case_sampled(build, tmp):
    # 4 tuning prompts, every 4th selects: 3 train and 1 selects, 2 seeds each (and the greedy trace).
    for extra, traces, also_greedy in (([], 2, 0), (["--also-greedy"], 3, 1)):
        out = os.path.join(tmp, "policy" + "".join(extra))
        p = train(build, out, "--temperature", "0.8", "--seeds", "2", *extra)
        if p.returncode != 0:
            fail(f"{extra}: status {p.returncode}\n{p.stderr[-2000:]}")
        with open(os.path.join(out, "training_report.json")) as f:
            report = json.load(f)
        requests = report["requests"]
        if requests != {"train": 3 * traces, "selection": traces}:
            fail(f"{extra}: requests {requests}, want {3 * traces} training and {traces} selection traces "
                 f"(4 prompts x {traces})")
        with open(os.path.join(out, "policy.json")) as f:
            meta = json.load(f)
        options = meta["training_options"]
        if (options.get("temperature") != 0.8 or options.get("seeds") != 2 or options.get("top_p") != 1
                or options.get("also_greedy") != also_greedy):
            fail(f"{extra}: training_options do not record the sampling: {options}")
        if meta["features"]["spec"] != "lede-features-v6" or meta["features"]["names"][-1] != "temperature_div2":
            fail(f"{extra}: the policy's features lack the temperature: {meta['features']}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("bad", "sampled"):
        print(__doc__)
        return 2
    tmp = tempfile.mkdtemp(prefix="lede-cf-cli-")
    try:
        {"bad": case_bad, "sampled": case_sampled}[sys.argv[1]](os.path.abspath(sys.argv[2]), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
