#!/usr/bin/python3
"""llama.cpp runs this project's checkpoints: models/lede-tiny
exported by `lede export --format gguf` at f32, bf16 and q8_0 is decoded
greedily by llama.cpp itself (npm node-llama-cpp's prebuilt CPU binary,
through bench/llamacpp_bench.mjs) and by this engine from the same file with
the file's weights computed in f32 (--weights f32), and the two texts must be
identical: a wrong Q/K row order, tensor name,
dimension order, quantization layout or tokenizer key would change
llama.cpp's text. Every method of the benchmark runs (llama.cpp's prompt
lookup, our static and LEDE) and gives its engine's autoregressive text.
Where our native text parts from llama.cpp's, the step recorded must be one
where llama.cpp's greedy token is at least as likely as ours; the speculation
ceiling (--ceiling) names a round the model has. Speeds are recorded, never
asserted.

usage: llamacpp_peer_test.py LEDE_BIN
Exit 77 (ctest: skipped) when node or node-llama-cpp is not installed
(scripts/install_node_llama_cpp.sh).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

lede = sys.argv[1]
modules = os.environ.get("LEDE_NODE_LLAMA_CPP_MODULES", "/opt/lede-tools/node-llama-cpp/node_modules")
if shutil.which("node") is None or not os.path.exists(os.path.join(modules, "node-llama-cpp", "package.json")):
    print("skipped: node or node-llama-cpp not installed (scripts/install_node_llama_cpp.sh)")
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "result.json")
    subprocess.run(["node", "bench/llamacpp_bench.mjs", "--model", "models/lede-tiny", "--formats", "f32,bf16,q8_0",
                    "--threads", "1", "--tokens", "48", "--repeats", "1", "--prompt",
                    "Once upon a time, there was a little", "--static", "2:3", "--roofline", "", "--lede", lede, "--ceiling", "on",
                    "--out", out],
                   check=True, timeout=600)
    report = json.load(open(out))
layers = json.load(open("models/lede-tiny/config.json"))["num_hidden_layers"]
failures = []
for row in report["results"]:
    checks, n = row["checks"], row["checks"]["prompts"]
    if not all(t.strip() for t in row["llamacpp_texts"]):
        failures.append(f"{row['format']}: llama.cpp generated no text")
    if checks["same_greedy_text_f32_compute"] != n:
        failures.append(f"{row['format']}: llama.cpp's greedy text differs from this engine's on the file's weights "
                        f"in f32: {row['llamacpp_texts']!r}")
    if checks["same_first_tokens_f32_compute"] != n:
        failures.append(f"{row['format']}: the first {checks['first_tokens']} tokens differ in f32")
    if row["format"] == "f32" and checks["same_greedy_text_f32_attention"] != n:
        failures.append("f32: the texts differ with every weight and attention operation in float32")
    for d in checks["divergences"]:
        if not (0 <= d["token_index"] < 48 and d["llamacpp_p"] >= d["ours_p_under_llamacpp"]):
            failures.append(f"{row['format']}: a divergence llama.cpp's greedy choice does not explain: {d}")
    if checks["same_greedy_text_native"] + len(checks["divergences"]) > n:
        failures.append(f"{row['format']}: {n - checks['same_greedy_text_native']} native texts differ, "
                        f"{len(checks['divergences'])} divergences recorded")
    ceiling = row.get("speculation_ceiling") or {}
    best, verify = ceiling.get("best") or {}, ceiling.get("verify_over_step") or []
    if not (1 <= best.get("exit_layer", 0) < layers and 1 <= best.get("draft_len", 0) <= 6 and best.get("speedup", 0) > 0
            and len(verify) == 7 and verify[0] == 1):
        failures.append(f"{row['format']}: speculation ceiling {ceiling}")
    for key in ("llamacpp_lookup_lossless", "lede_static_lossless", "lede_lede_lossless"):
        if checks[key] != n:
            failures.append(f"{row['format']}: {key}: {checks[key]} of {n}")
    for method in ("llamacpp_ar", "llamacpp_prompt_lookup", "lede_ar", "lede_static", "lede_lede"):
        if not (row["methods"].get(method) or {}).get("median_tok_s"):
            failures.append(f"{row['format']}: {method} did not run")
formats = sorted(row["format"] for row in report["results"])
if formats != ["bf16", "f32", "q8_0"]:
    failures.append(f"formats run: {formats}")
for f in failures:
    print("FAIL:", f)
print(f"{len(report['results']) - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
