"""The command that reproduces each recorded result, for scripts/make_docs_tables.py.

COMMANDS maps a result JSON under bench/results/ to (kind, command): the kind
of benchmark (which renderer reads it) and the shell command, run from the
repository root, that records it again (bench/record.py). A result a table
uses must be listed here; bench/results/README.md says how results are
recorded and retired.
"""

MODEL = "models/lede-tiny"
_POLICIES = ",".join(f"{MODEL}/policy/{p}" for p in ("accelerator-v7", "measured-v9", "story-accelerator-v5",
                                                     "story-measured-v8"))
_WIDEN5 = "build/services/cli/lede widen --model models/lede-tiny --factor 5 --out out/w5t --overwrite"


def _bench_set(name):
    return (f"build/bench/lede-bench bench --model {MODEL} --calibration {MODEL}/calibration-cpu.json "
            f"--prompts {MODEL}/prompts/{name}.jsonl --candidate-layers 1,2,3,4,5,6 --policy {_POLICIES} "
            f"--max-draft-len 6 --prompts-per-set 48 --new-tokens 64 --threads 1 --json {{json}}")


def _llamacpp_w8(threads):
    return ("scripts/install_node_llama_cpp.sh\n"
            "build/services/cli/lede widen --model models/lede-tiny --factor 8 --out out/lede-tiny-w8\n"
            f"node bench/llamacpp_bench.mjs --model out/lede-tiny-w8 --formats q4_k_m,q4_0,q8_0 --threads {threads} \\\n"
            "    --tokens 96 --repeats 3 --eval-prompts 8 --static \"\" --policy \"\" --lookup \"\" --prefill-tokens 400 \\\n"
            f"    --out bench/results/llamacpp-w8-quant-{threads}t.json")


# The synthetic profiles of cost-v7 and of the policies trained after it (PROBE:LAYER:VERIFY, autoregressive
# steps): the Intel Xeon VM's measured one-thread q8_0 and bf16 and two-thread q8_0 profiles (cost-v6's training
# report), neighbours of the AMD EPYC VM's one-thread q8_0 profile (probe 0.018, layer 0.94, verify 0.28; its
# calibration is the measured profile) and one where no speculation pays.
COST_V7_AROUND = ("0.014:0.706:0.048 0.015:1.167:0.034 0.015:0.700:0.124 0.018:0.7:0.28 0.018:1.2:0.28 "
                  "0.018:0.94:0.45 0.01:0.8:0.8")


def _widen5_cost(weights, sampled=False, threads=1):
    """lede-bench on the 5x widening at one weight format and thread count, greedy or sampled at temperature 0.8
    with 3 seeds. Every row runs the same policies, the ones `lede widen` installs: the shipped accelerator-v1,
    cost-v8 (trained on greedy and sampled requests across the profiles of both VM types this project has run
    on, with the lookahead probe), cost-v10 (cost-v8's recipe with the exit layer chosen on probes,
    --probe-candidates) and cost-v11 (cost-v10's with a rho per kind of request, --rho-per-sampling), each shown
    the step costs the run meters of itself (--policy-costs served); every timed
    round is kept (--rounds-out). The calibration times its rounds in generations of the tuning prompts, as
    scripts/train_widened_policies.sh does, at the benchmark's thread count. The q8_0 one-thread row also lists
    how cost-v8, cost-v10 and cost-v11 were trained (on that row's calibration and synthetic profiles)."""
    w5 = "out/lede-tiny-w5"
    trained_on = weights == "q8_0" and threads == 1
    suffix = "" if threads == 1 else f"-{threads}t"
    name = f"widen5-cost-{weights}{suffix}" + ("-t0.8" if sampled else "")
    calibration = f"{w5}/calibration-{weights}{suffix}.json"
    others = "  # and the other formats" if threads == 1 else ""
    tuning = "out/widened-policies/tuning-prompts.jsonl"
    return ("build/services/cli/lede widen --model models/lede-tiny --factor 5 --out out/lede-tiny-w5 --overwrite\n"
            f"mkdir -p out/widened-policies && {{ head -n 12 {MODEL}/prompts/story.jsonl; "
            f"head -n 12 {MODEL}/prompts/code.jsonl; }} > {tuning}\n"
            f"build/services/cli/lede calibrate --model {w5} --weights {weights} --threads {threads} --repeats 20 "
            f"--round-passes 3 --round-max-draft-len 6 --batch-sizes \"\" --prompts {tuning} --new-tokens 64 "
            f"--out {calibration}{others}\n"
            + ("".join(f"LEDE_MODEL=out/lede-tiny-w5 LEDE_WIDEN_COST=1 LEDE_WIDEN_ONLY_COST=1 LEDE_WIDEN_FORMATS=q8_0 "
                       f"LEDE_WIDEN_AROUND=\"{COST_V7_AROUND}\" LEDE_WIDEN_COST_VERSION={v} "
                       f"LEDE_WIDEN_COST_FLAGS=\"--temperature 0.8 --seeds 1 --also-greedy --lookahead-probe{extra}\" "
                       f"scripts/train_widened_policies.sh 5 cost-v8  # {v}{note}\n"
                       for v, extra, note in (("cost-v8", "", ", SERVING"), ("cost-v10", " --probe-candidates", ""),
                                              ("cost-v11", " --probe-candidates --rho-per-sampling", "")))
               if trained_on else "")
            + f"bench/record.py bench/results/{name}.json -- \\\n    "
            f"build/bench/lede-bench bench --model {w5} --weights {weights} --threads {threads} "
            f"--calibration {calibration} "
            f"--prompts {MODEL}/prompts/story.jsonl,{MODEL}/prompts/code.jsonl --prompts-per-set 24 --new-tokens 64 "
            "--repeats 3 --methods ar,static,calibrated,lede --candidate-layers 1,2,3,4,5,6 --max-draft-len 6 "
            + ("--temperature 0.8 --seeds 3 " if sampled else "")
            + "--policy-costs served "
            + f"--policy {w5}/policy/accelerator-v1,{w5}/policy/cost-v8,{w5}/policy/cost-v10,{w5}/policy/cost-v11 "
            + f"--rounds-out out/widened-policies/rounds-{name}.jsonl"
            + " --json {json}")


# Each result a table uses: what kind of JSON it holds, and the command that writes it.
COMMANDS = {
    **{f"bench/results/widen5-cost-{w}.json": ("lede-bench bench", _widen5_cost(w)) for w in ("q8_0", "f32", "bf16")},
    "bench/results/widen5-cost-q8_0-t0.8.json": ("lede-bench bench", _widen5_cost("q8_0", sampled=True)),
    "bench/results/widen5-cost-q8_0-2t.json": ("lede-bench bench", _widen5_cost("q8_0", threads=2)),
    "bench/results/lede-tiny-bench.json":
        ("lede-bench bench", "bench/record.py bench/results/lede-tiny-bench.json -- \\\n    "
         + _bench_set("story") + " -- \\\n    " + _bench_set("code")),
    "bench/results/lede-tiny-eval-exits.json":
        ("lede-eval-exits", "bench/record.py bench/results/lede-tiny-eval-exits.json -- build/trainer/lede-eval-exits "
         f"--model {MODEL} --calibration {MODEL}/calibration-cpu.json "
         "--data out/corpus/stories.val.txt,out/corpus/code.val.txt --exit-layers 1,2,3,4,6 --draft-lens 1,2,3,4,6 "
         "--prompts 24 --new-tokens 64 --threads 1 --out {json}"),
    "bench/results/lede-tiny-eval-sources.json":
        ("eval-sources", "scripts/eval_by_source.sh   # after scripts/train_lede_tiny.sh"),
    "bench/results/lede-tiny-weight-formats.json":
        ("weight_formats_quality", "for w in f32 bf16 q8_0; do build/trainer/lede-eval-exits --model models/lede-tiny "
         "--calibration models/lede-tiny/calibration-cpu.json --data testdata/corpus/tinystories_val_a.txt "
         "--exit-layers 2 --draft-lens 3 --prompts 4 --new-tokens 32 --eval-tokens 16384 --threads 1 --weights $w "
         "--out /tmp/evq/$w.json; done   # then the per-layer tables combined into one file"),
    "bench/results/llamacpp-w5-trained.json":
        ("llamacpp_bench", "scripts/install_node_llama_cpp.sh\n" + _WIDEN5 + "\n"
         "node bench/llamacpp_bench.mjs --model out/w5t --policy out/w5t/policy --formats f32,bf16,q8_0 --threads 1 \\\n"
         "    --tokens 96 --repeats 3 --eval-prompts 8 --tuning-prompts 4 --static 1:3,1:4,2:2,2:3,2:4,3:3,3:4 \\\n"
         "    --out bench/results/llamacpp-w5-trained.json"),
    "bench/results/lede-tiny-perplexity.json":
        ("perplexity", "bench/heldout_text.py   # writes out/heldout-text (checks it against data_manifest.json)\n"
         "build/services/cli/lede widen --model models/lede-tiny --factor 4 --out out/lede-tiny-w4\n"
         "build/services/cli/lede export --format gguf --weights q4_k_m --model out/lede-tiny-w4 \\\n"
         "    --out out/lede-tiny-w4-q4_k_m.gguf\n"
         "D=out/heldout-text; P=build/bench/lede-perplexity; F=f32,bf16,q8_0,q4_0,q4_k_m\n"
         "bench/record.py bench/results/lede-tiny-perplexity.json -- $P --models models/lede-tiny \\\n"
         "    --data $D/stories-tinystories.val.txt,$D/tales.val.txt,$D/drama.val.txt --weights $F --window 256 \\\n"
         "    --stride 128 --json {json} -- $P --models out/lede-tiny-w4 --data $D/stories-tinystories.val.txt \\\n"
         "    --weights $F --window 256 --stride 128 --json {json} -- $P --models out/lede-tiny-w4-q4_k_m.gguf \\\n"
         "    --data $D/stories-tinystories.val.txt --weights auto --window 256 --stride 128 --json {json}"),
    "bench/results/llamacpp-w8-quant-1t.json": ("llamacpp_bench", _llamacpp_w8(1)),
    "bench/results/llamacpp-w8-quant-2t.json": ("llamacpp_bench", _llamacpp_w8(2)),
    "bench/results/llamacpp-w8-q4_k_m-lede.json":
        ("llamacpp_bench", "scripts/install_node_llama_cpp.sh\n"
         "build/services/cli/lede widen --model models/lede-tiny --factor 8 --out out/lede-tiny-w8 --overwrite\n"
         "node bench/llamacpp_bench.mjs --model out/lede-tiny-w8 --formats q4_k_m --threads 1,2 --tokens 96 \\\n"
         "    --repeats 3 --eval-prompts 8 --static 1:1,1:2,1:3,1:4,2:1,2:2,2:3,2:4,3:1,3:2,3:3,3:4 --lookup \"\" \\\n"
         "    --ceiling on --out bench/results/llamacpp-w8-q4_k_m-lede.json"),
    "bench/results/llamacpp-1b-prefill.json":
        ("llamacpp_bench", "scripts/install_node_llama_cpp.sh\n"
         "scripts/smoke_llama32_1b.sh   # once: writes build/smoke/llama32-1b\n"
         "node bench/llamacpp_bench.mjs --model build/smoke/llama32-1b --formats q4_k_m,q8_0 --threads 2,1 \\\n"
         "    --tokens 16 --repeats 2 --eval-prompts 2 --static \"\" --policy \"\" --lookup \"\" --prefill-tokens 2000 \\\n"
         "    --out bench/results/llamacpp-1b-prefill.json"),
    "bench/results/serve-widen5-fixes.json":
        ("serve_bench", _WIDEN5 + "\n"
         "bench/record.py bench/results/serve-widen5-fixes.json -- /usr/bin/python3 bench/serve_bench.py \\\n"
         "    --model out/w5t --prompt-file models/lede-tiny/prompts/story.jsonl --deployments split \\\n"
         "    --methods autoregressive,lede --concurrency 1,16 --max-batch 1,16 --num-prompts 32 --new-tokens 64 \\\n"
         "    --check-solo 24 --json '{json}'"),
    "bench/results/engine_bench-memory-w5.json":
        ("lede_engine_bench isolated", "build/services/cli/lede widen --model models/lede-tiny --factor 5 --out out/w5\n"
         "bench/record.py bench/results/engine_bench-memory-w5.json -- build/bench/lede_engine_bench \\\n"
         "    --models out/w5 --kernels fused --weights f32,bf16,q8_0 --isolate --repeats 5 --tokens 64 \\\n"
         "    --threads 1 --no-gemv --json {json}"),
    "bench/results/engine_bench-memory-llama32-1b.json":
        ("lede_engine_bench isolated", "scripts/smoke_llama32_1b.sh   # once: writes build/smoke/llama32-1b\n"
         "bench/record.py bench/results/engine_bench-memory-llama32-1b.json -- build/bench/lede_engine_bench \\\n"
         "    --models build/smoke/llama32-1b --kernels fused --weights bf16,q8_0 --isolate --repeats 3 --tokens 32 \\\n"
         "    --threads 1 --no-gemv --json {json}"),
    "bench/results/services-w5-q8_0.json":
        ("services_bench", "build/services/cli/lede widen --model models/lede-tiny --factor 5 --out out/lede-tiny-w5 "
         "--overwrite  # installs the shipped policies\n"
         "bench/record.py bench/results/services-w5-q8_0.json \\\n" + "".join(
             f"    -- bench/services_bench.py --model out/lede-tiny-w5 --weights q8_0 --threads {t} \\\n"
             "       --policy out/lede-tiny-w5/policy/cost-v2 --deployments split --prompts 8 --json {json}"
             + (" \\\n" if t == 1 else "") for t in (1, 2))),
    "bench/results/big-model-serving-llama32-1b.json":
        ("big_model_serving", "bench/record.py bench/results/big-model-serving-llama32-1b.json -- \\\n"
         "    bench/big_model_serving.py --threads 2 --repeats 2 --json {json}"),
    "bench/results/retrain-acceptance.json":
        ("retrain acceptance", "bench/retrain_bench.py acceptance"),
    "bench/results/retrain-widened.json":
        ("retrain widened", "bench/retrain_bench.py widened --traffic 200 --eval-prompts 12 --rounds 3"),
    "bench/results/hostile_clients.json":
        ("hostile_clients", "bench/record.py bench/results/hostile_clients.json -- bench/hostile_clients_bench.py \\\n"
         "    --slow 200 --trickle-s 2 --hold-s 30 --requests 10 --ports-base 4700 --json {json}"),
    "bench/results/cancel_storm.json":
        ("cancel_storm", "bench/record.py bench/results/cancel_storm.json -- bench/cancel_storm_bench.py \\\n"
         "    --runs 3 --cancels 300 --ports-base 4900 --json {json}"),
    # The demo model's training report (lede-pretrain writes it with the model) and its policies'
    # artifacts (policy/*/policy.json: offline metrics of each shipped version).
    f"{MODEL}/report.json": ("pretrain report", "scripts/train_lede_tiny.sh 1200 1 2100 2"),
    f"{MODEL}/policy": ("policy artifacts", "scripts/train_policies.sh"),
}


class DocsError(Exception):
    pass
