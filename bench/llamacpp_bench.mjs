#!/usr/bin/env node
// The llama.cpp peer benchmark: llama.cpp (npm `node-llama-cpp`,
// its prebuilt CPU binary, getLlama({gpu: false, build: "never"}): nothing is
// downloaded or built at run time) and this engine decode the same GGUF
// files greedily on held-out prompts, and the benchmark prints, per weight
// format and thread count, side by side:
//   llama.cpp autoregressive, llama.cpp prompt lookup (node-llama-cpp's own
//   speculative mode: InputLookupTokenPredictor, its default settings),
//   our autoregressive, our best static self-speculation (E, D swept on the
//   tuning prompts, measured on the held-out ones) and our LEDE (--policy),
// each run's effective GB/s (weight bytes read per token x tok/s; for the
// autoregressive rows, which read every matrix once per token) as a share
// of this machine's read bandwidth (`lede_engine_bench --roofline-only`,
// measured before, between and after the runs; the best is used), and
// whether the engines produced the
// same greedy text. Results go to a JSON file (command, commit, date,
// machine) under bench/results/.
//
// usage: node bench/llamacpp_bench.mjs --model DIR [--formats f32,bf16,q8_0]
//          [--threads 1,2] [--tokens 96] [--repeats 3]
//          [--prompts FILE.jsonl] [--prompts-per-set 48] [--eval-prompts 8]
//          [--tuning-prompts 4] [--prompt TEXT]
//          [--static 1:3,1:4,2:2,2:3,2:4,3:3,3:4] [--policy DIR] [--lookup on]
//          [--ceiling on]
//          [--lede build/services/cli/lede]
//          [--roofline build/bench/lede_engine_bench] [--prefill-tokens 0]
//          [--out bench/results/FILE.json]
//        node bench/llamacpp_bench.mjs --gguf FILE.gguf[,FILE2.gguf] ...
//   --formats     f32, f16, bf16, q8_0, and llama.cpp's q4_0 and q4_k_m
//                 tensor mixes
//   --model DIR   a checkpoint: exported once per format with
//                 `lede export --format gguf --weights FORMAT` into a
//                 temporary directory
//   --gguf FILES  GGUF files to run as they are (format read from the name)
//   --prompts     the prompt set, split as lede-bench splits it
//                 (trainer/corpus.h LoadPromptSet): its first
//                 --prompts-per-set prompts, the first half tuning, the
//                 second half held out; the runs use the first
//                 --eval-prompts held-out prompts, the static sweep the
//                 first --tuning-prompts tuning prompts
//   --prompt TEXT one prompt instead (no split; the sweep runs on it too)
//   --repeats N   interleaved passes over the held-out prompts; each pass
//                 runs every method on every prompt, and its tok/s is the
//                 pass's tokens over its decode seconds; medians and ranges
//                 are over the passes
//   --static      E:D settings of our static self-speculation, swept on the
//                 tuning prompts per format and thread count (two rounds,
//                 the second in reverse order); the best (tokens over
//                 decode seconds of both) runs on the held-out ones; "" = off
//   --policy DIR  LEDE with this policy (a version directory or a root with
//                 SERVING; default: MODEL/policy with --model); "" = off
//   --lookup on   the llama.cpp prompt-lookup row; "" = off
//   --ceiling on  also time this engine's speculation rounds on the file
//                 (`lede calibrate`: K drafts at exit layer E and their
//                 verification, in the decoding loop, for E in 1..L and K
//                 in 1..6) and record the ceiling of any speculation, ours
//                 or a policy's: the best (K + 1) autoregressive steps over
//                 one round, the speed-up if every draft were accepted;
//                 "" = off
//   --lede BIN    this engine's CLI; "" to run llama.cpp alone
//   --roofline BIN  the engine benchmark whose --roofline-only mode measures
//                 the read bandwidth; "" = skip
//   --prefill-tokens N  also time the prefill of one N-token prompt (BOS
//                 included; 0 = off) in each pass: the held-out prompts of
//                 the set joined by spaces, cut at N - 1 tokens by
//                 llama.cpp's tokenizer and detokenized (this engine
//                 tokenizes the same text; both counts are recorded).
//                 llama.cpp: a fresh context (batch 512) and
//                 evaluateWithoutGeneratingNewTokens over the ids, timed
//                 around that call; ours: `lede generate --max-new-tokens 2
//                 --repeat 2` on the prompt, its own prefill seconds of the
//                 second generation (the first is a warm-up)
// Needs scripts/install_node_llama_cpp.sh (LEDE_NODE_LLAMA_CPP_MODULES, else
// /opt/lede-tools/node-llama-cpp/node_modules).
//
// What is timed: llama.cpp: from the first generated token to the last
// (tokens - 1 decode steps, the prompt's evaluation excluded); this engine:
// `lede generate`'s own decode tokens/s per prompt (one process per method
// and pass: --prompt-file with all the prompts, the first one generated once
// more first as a warm-up that is not counted), with --weights auto (the
// file's storage: bf16 or q8_0 kernels). Generations stop at EOS in both
// engines; a pass's tok/s is its tokens over its decode seconds. The text
// check runs `lede generate --weights f32` (the file's weights, dequantized)
// once per prompt, and both engines once more with attention in float32
// (float32 K/V caches, llama.cpp's flash attention off: its defaults round
// attention through float16, ours K/V through bfloat16, and a rounding can
// order two near-equal tokens either way); where our native text parts from
// llama.cpp's, llama.cpp's probabilities of both tokens at that step.
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
  const o = {
    model: "", gguf: "", formats: "f32,bf16,q8_0", threads: "1,2", tokens: 96, repeats: 3,
    prompts: "models/lede-tiny/prompts/story.jsonl", "prompts-per-set": 48, "eval-prompts": 8, "tuning-prompts": 4,
    prompt: "", lede: "build/services/cli/lede", roofline: "build/bench/lede_engine_bench", out: "",
    "prefill-tokens": 0,
    static: "1:3,1:4,2:2,2:3,2:4,3:3,3:4", policy: null, lookup: "on", ceiling: "",
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith("--") || !(a.slice(2) in o) || i + 1 >= argv.length) {
      console.error(`llamacpp_bench: bad argument ${a} (see the header of ${process.argv[1]})`);
      process.exit(2);
    }
    const k = a.slice(2);
    o[k] = typeof o[k] === "number" ? Number(argv[++i]) : argv[++i];
  }
  if (o.policy === null) {
    o.policy = o.model && fs.existsSync(path.join(o.model, "policy")) ? path.join(o.model, "policy") : "";
  }
  if (!o.model && !o.gguf) {
    console.error("llamacpp_bench: --model DIR or --gguf FILES is required");
    process.exit(2);
  }
  if (!(o.repeats >= 1) || !(o.tokens >= 2)) {
    console.error("llamacpp_bench: --repeats must be >= 1 and --tokens >= 2");
    process.exit(2);
  }
  return o;
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : null;
}

function spread(xs) {
  return { median: median(xs), min: xs.length ? Math.min(...xs) : null, max: xs.length ? Math.max(...xs) : null };
}

function sh(cmd, args) {
  try {
    return execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }).trim();
  } catch {
    return "";
  }
}

// The prompts: the held-out half of the set (and the tuning half for the
// sweep), split as trainer/corpus.cc LoadPromptSet splits a .jsonl file.
function loadPrompts(o) {
  if (o.prompt) return { tuning: [o.prompt], eval: [o.prompt], heldout: [o.prompt], source: "--prompt" };
  const all = [];
  for (const line of fs.readFileSync(o.prompts, "utf8").split("\n")) {
    if (all.length >= o["prompts-per-set"]) break;
    if (!line.trim()) continue;
    const j = JSON.parse(line);
    const text = typeof j.prompt === "string" ? j.prompt
      : Array.isArray(j.turns) && j.turns.length ? j.turns[0]
      : typeof j.text === "string" ? j.text : typeof j.input === "string" ? j.input : "";
    if (text) all.push(text);
  }
  if (all.length < 2) {
    console.error(`llamacpp_bench: ${o.prompts}: fewer than 2 prompts`);
    process.exit(2);
  }
  if (all.some((p) => p.includes("\n"))) {
    console.error(`llamacpp_bench: ${o.prompts}: a prompt holds a newline (lede generate --prompt-file reads lines)`);
    process.exit(2);
  }
  const half = Math.floor(all.length / 2);
  return {
    tuning: all.slice(0, half).slice(0, o["tuning-prompts"]),
    eval: all.slice(half).slice(0, o["eval-prompts"]),
    heldout: all.slice(half),
    source: `${o.prompts}: prompts ${half}..${half + Math.min(o["eval-prompts"], all.length - half) - 1} ` +
            `(held out; tuning: 0..${Math.min(o["tuning-prompts"], half) - 1}) of the first ${all.length}`,
  };
}

const o = parseArgs(process.argv.slice(2));
const modules = process.env.LEDE_NODE_LLAMA_CPP_MODULES || "/opt/lede-tools/node-llama-cpp/node_modules";
const entry = path.join(modules, "node-llama-cpp", "dist", "index.js");
if (!fs.existsSync(entry)) {
  console.error(`llamacpp_bench: ${entry} not found; run scripts/install_node_llama_cpp.sh`);
  process.exit(1);
}
const { getLlama, InputLookupTokenPredictor, readGgufFileInfo } = await import(pathToFileURL(entry).href);
const nlcVersion = JSON.parse(fs.readFileSync(path.join(modules, "node-llama-cpp", "package.json"), "utf8")).version;
const prompts = loadPrompts(o);
// Provenance as the run starts (the tree may change while it runs).
const commit = sh("git", ["rev-parse", "HEAD"]);
// Results under bench/results are outputs, not the code measured (bench/record.py).
const dirty = sh("git", ["status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results"]) !== "";

// This machine's read bandwidth (one core): the engine benchmark's read loop.
function roofline() {
  if (!o.roofline) return null;
  try {
    return JSON.parse(execFileSync(o.roofline, ["--roofline-only"], { encoding: "utf8" }).trim().split("\n").pop());
  } catch (e) {
    console.error(`llamacpp_bench: ${o.roofline} --roofline-only failed: ${String(e.message || e).split("\n")[0]}`);
    return null;
  }
}
// Measured before the runs, after each file and at the end; the best is
// used (a busy VM lowers a measurement, nothing raises it).
const rooflines = [];
function measureRoofline(when) {
  const r = roofline();
  if (!r) return;
  rooflines.push({ when, ...r });
  console.log(`read roofline (one core, DRAM), ${when}: ${r.dram_read_gb_per_s.toFixed(1)} GB/s`);
}
const bestRoofline = () => (rooflines.length ? Math.max(...rooflines.map((r) => r.dram_read_gb_per_s)) : null);
for (let i = 0; i < 3; i++) measureRoofline("before the runs");

// The GGUF files: given, or exported from --model once per format.
let files = [];
const workDir = fs.mkdtempSync(path.join(os.tmpdir(), "lede-llamacpp-bench-"));
if (o.gguf) {
  files = o.gguf.split(",").map((f) => ({ file: f, format: (f.match(/(f32|f16|bf16|q8_0|q4_k_m|q4_0)/i) || ["", "?"])[1].toLowerCase() }));
} else {
  const dir = workDir;
  for (const format of o.formats.split(",")) {
    const file = path.join(dir, `${path.basename(path.resolve(o.model))}-${format}.gguf`);
    execFileSync(o.lede, ["export", "--format", "gguf", "--weights", format, "--model", o.model, "--out", file],
                 { stdio: ["ignore", "ignore", "inherit"] });
    files.push({ file, format });
  }
}
const threadCounts = o.threads.split(",").map(Number);

// Weight bytes one autoregressive token reads: every tensor once, except the
// token embedding (one row; the whole table when it is also the LM head).
// ggml F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K (bytes per value)
const kTypeBytes = { 0: 4, 1: 2, 30: 2, 8: 34 / 32, 2: 18 / 32, 6: 22 / 32, 12: 144 / 256, 13: 176 / 256, 14: 210 / 256 };
async function bytesPerToken(file) {
  const info = await readGgufFileInfo(file, { readTensorInfo: true, logWarnings: false });
  const tensors = info.fullTensorInfo || info.tensorInfo || [];
  const tied = !tensors.some((t) => t.name === "output.weight");
  let bytes = 0;
  for (const t of tensors) {
    if (t.name === "token_embd.weight" && !tied) continue;
    const n = t.dimensions.reduce((a, d) => a * Number(d), 1);
    if (!(t.ggmlType in kTypeBytes)) return null;
    bytes += n * kTypeBytes[t.ggmlType];
  }
  return bytes;
}

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });

// One llama.cpp generation: greedy, `o.tokens` tokens, decode timed from the
// first generated token to the last; with `lookup`, node-llama-cpp's
// prompt-lookup predictor (its defaults) drafts from the prompt; with
// `f32Attention`, attention in float32 throughout: F32 K and V caches and
// flash attention off (llama.cpp's defaults, F16 caches and its CPU flash
// attention, compute attention partly in float16).
async function llamaCppRun(model, prompt, threads, lookup, f32Attention) {
  const ids = [model.tokens.bos, ...model.tokenize(prompt, false)];
  const ctx = await model.createContext({ contextSize: ids.length + o.tokens + 16, threads, batchSize: 512,
                                          ...(f32Attention ? { experimentalKvCacheKeyType: "F32",
                                                               experimentalKvCacheValueType: "F32",
                                                               flashAttention: false } : {}) });
  const seq = lookup ? ctx.getSequence({ tokenPredictor: new InputLookupTokenPredictor() }) : ctx.getSequence();
  if (lookup) seq.tokenPredictor.updateInputTokens(ids.slice());
  const out = [];
  let t1 = 0;
  for await (const tok of seq.evaluate(ids, { temperature: 0 })) {
    if (out.length === 0) t1 = performance.now();
    out.push(tok);
    if (out.length >= o.tokens) break;
  }
  const seconds = (performance.now() - t1) / 1000;
  const predictions = lookup ? { ...seq.tokenPredictions } : undefined;
  await ctx.dispose();
  return { tokens: out.length - 1, seconds, text: model.detokenize(out), ids: out, predictions };
}

// Where our greedy text leaves llama.cpp's: llama.cpp decodes the prompt
// greedily again, now returning each step's probabilities, until its token
// differs from ours (`ours`: our text, prompt first, in llama.cpp's
// tokens). Returns null when none differs in `o.tokens`; else the step and
// llama.cpp's probabilities of its own token and of ours there, so a
// difference at a near tie (two tokens of about equal probability, which
// any change of rounding may order either way) is told from a real one.
async function divergence(model, prompt, ours, threads) {
  const ids = [model.tokens.bos, ...model.tokenize(prompt, false)];
  const oursIds = model.tokenize(ours, false).slice(ids.length - 1);
  const ctx = await model.createContext({ contextSize: ids.length + o.tokens + 16, threads, batchSize: 512 });
  let found = null, k = 0;
  for await (const step of ctx.getSequence().evaluateWithMetadata(ids, { probabilities: true }, { temperature: 0 })) {
    if (step.token !== oursIds[k]) {
      found = { token_index: k, llamacpp_token: model.detokenize([step.token]),
                ours_token: oursIds[k] == null ? null : model.detokenize([oursIds[k]]),
                llamacpp_p: step.probabilities.get(step.token) ?? 0,
                ours_p_under_llamacpp: oursIds[k] == null ? 0 : step.probabilities.get(oursIds[k]) ?? 0 };
      break;
    }
    if (++k >= o.tokens) break;
  }
  await ctx.dispose();
  return found;
}

// The prefill prompt (--prefill-tokens): the held-out prompts joined by
// spaces until llama.cpp's tokenizer gives n - 1 ids, cut there and
// detokenized (BOS makes n).
function prefillText(model, n) {
  let text = "";
  let ids = [];
  for (let i = 0; ids.length < n - 1; i++) {
    text += (text ? " " : "") + prompts.heldout[i % prompts.heldout.length];
    ids = model.tokenize(text, false);
  }
  return model.detokenize(ids.slice(0, n - 1)).replace(/\s+/g, " ").trim();
}

// One llama.cpp prefill of `text`: BOS + its ids through a fresh context in
// one evaluation call (no token generated), timed around that call.
async function llamaCppPrefill(model, text, threads) {
  const ids = [model.tokens.bos, ...model.tokenize(text, false)];
  const ctx = await model.createContext({ contextSize: ids.length + 16, threads, batchSize: 512 });
  const seq = ctx.getSequence();
  const t0 = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(ids);
  const seconds = (performance.now() - t0) / 1000;
  await ctx.dispose();
  return { tokens: ids.length, seconds };
}

// One `lede generate` process prefilling `text` twice (--repeat 2; the first
// a warm-up): the prefill seconds of the second, as lede generate reports
// them on its stats line.
function ledePrefill(file, text, threads) {
  const promptFile = path.join(workDir, `prompts-${promptFileSerial++}.txt`);
  fs.writeFileSync(promptFile, text + "\n");
  const r = spawnSync(o.lede, ["generate", "--model", file, "--prompt-file", promptFile, "--separator", kSeparator,
                               "--mode", "ar", "--max-new-tokens", "2", "--repeat", "2", "--threads", String(threads)],
                      { encoding: "utf8", maxBuffer: 64 << 20 });
  fs.rmSync(promptFile, { force: true });
  if (r.status !== 0) throw new Error(`lede generate exited ${r.status}: ${(r.stderr || "").trim().split("\n").pop()}`);
  const seconds = [...r.stderr.matchAll(/\(prefill ([0-9.]+) s\)/g)].map((m) => Number(m[1]));
  if (seconds.length !== 2) throw new Error(`lede generate printed ${seconds.length} prefill times for 2 generations`);
  return seconds[1];
}

// The ceiling of speculation on `file` at `threads` (--ceiling): `lede
// calibrate` times rounds of K drafts at exit layer E with their
// verification in the decoding loop; with every draft accepted a round
// yields K + 1 tokens, so no method beats (K + 1) x ar_step_us / round_us
// at its best E and K.
function speculationCeiling(file, threads) {
  const out = path.join(workDir, `calibration-${promptFileSerial++}.json`);
  const r = spawnSync(o.lede, ["calibrate", "--model", file, "--threads", String(threads), "--repeats", "10",
                               "--round-passes", "2", "--round-max-draft-len", "6", "--batch-sizes", "",
                               "--out", out], { encoding: "utf8", maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`lede calibrate exited ${r.status}: ${(r.stderr || "").trim().split("\n").pop()}`);
  const cal = JSON.parse(fs.readFileSync(out, "utf8"));
  fs.rmSync(out, { force: true });
  let best = null;
  cal.round_us.forEach((byK, e) => byK.forEach((us, k) => {
    const speedup = (k + 2) * cal.ar_step_us / us;
    if (!best || speedup > best.speedup) best = { exit_layer: e + 1, draft_len: k + 1, speedup };
  }));
  return { source: "lede calibrate --repeats 10 --round-passes 2 --round-max-draft-len 6", ar_step_us: cal.ar_step_us,
           verify_over_step: cal.block_us.slice(0, 7).map((us) => us / cal.block_us[0]), best };
}

// This engine's token count of `text` (BOS included): `lede tokenize`.
function ledeTokenCount(file, text) {
  const out = execFileSync(o.lede, ["tokenize", "--model", file, text], { encoding: "utf8" }).trim();
  return JSON.parse(out.split("\n").pop()).length;
}

// One `lede generate` process on `prompts` (--prompt-file, one model load):
// `mode` ar, static (E, D), lede (the policy) or reference (ar on the file's
// weights in f32: the text check). The first prompt is generated once more
// first, as a warm-up that is not counted. Returns one run per prompt.
const kSeparator = "<|llamacpp-bench-end|>";
const kFirstTokens = 32;  // the prefix the text check counts apart (docs/benchmarks.md)
let promptFileSerial = 0;
function ledeRuns(file, prompts, threads, mode, sd) {
  const extra = [];
  let warm = true;
  if (mode === "static") extra.push("--exit-layer", String(sd[0]), "--draft-len", String(sd[1]));
  if (mode === "lede") extra.push("--policy", o.policy);
  if (mode === "reference") {
    mode = "ar";
    warm = false;
    extra.push("--weights", "f32");
  }
  if (mode === "f32_attention") {
    mode = "ar";
    warm = false;
    extra.push("--kv-dtype", "float32");
  }
  const list = warm ? [prompts[0], ...prompts] : prompts;
  const promptFile = path.join(workDir, `prompts-${promptFileSerial++}.txt`);
  fs.writeFileSync(promptFile, list.join("\n") + "\n");
  const r = spawnSync(o.lede, ["generate", "--model", file, "--prompt-file", promptFile, "--separator", kSeparator,
                               "--mode", mode, "--max-new-tokens", String(o.tokens), "--threads", String(threads),
                               ...extra], { encoding: "utf8", maxBuffer: 64 << 20 });
  fs.rmSync(promptFile, { force: true });
  if (r.status !== 0) throw new Error(`lede generate exited ${r.status}: ${(r.stderr || "").trim().split("\n").pop()}`);
  // The texts on stdout, each followed by the separator line; one
  // "[mode] N tokens, X tokens/s, acceptance rate A" line per generation on stderr.
  const texts = r.stdout.split(kSeparator + "\n").slice(0, -1);
  const stats = [...r.stderr.matchAll(/^\[[^\]]+\] (\d+) tokens, ([0-9.]+) tokens\/s, acceptance rate ([0-9.naif-]+)/gm)]
    .map((m) => ({ tokens: Number(m[1]), tok_s: Number(m[2]), acceptance: Number(m[3]) }));
  if (texts.length !== list.length || stats.length !== list.length) {
    throw new Error(`lede generate printed ${texts.length} texts and ${stats.length} stats lines for ${list.length} prompts`);
  }
  return stats.map((st, i) => ({ tokens: st.tokens, seconds: st.tokens / st.tok_s, text: texts[i],
                                 acceptance: st.acceptance })).slice(warm ? 1 : 0);
}

const tokS = (runs) => runs.reduce((a, r) => a + r.tokens, 0) / runs.reduce((a, r) => a + r.seconds, 0);
const f1 = (x) => (x == null || !Number.isFinite(x) ? "-" : x.toFixed(1));
const f2 = (x) => (x == null || !Number.isFinite(x) ? "-" : x.toFixed(2));

const loadBefore = os.loadavg();
const results = [];
for (const { file, format } of files) {
  const bytes = fs.statSync(file).size;
  const perToken = await bytesPerToken(file);
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  for (const threads of threadCounts) {
    console.log(`== ${format}, ${threads} thread(s): ${path.basename(file)}, ${(bytes / 1e6).toFixed(1)} MB, ` +
                `${perToken ? (perToken / 1e6).toFixed(1) : "?"} MB read per autoregressive token`);
    // The static sweep on the tuning prompts.
    let best = null;
    const sweep = [];
    if (o.lede && o.static) {
      // Two rounds, the second in reverse order; each setting's tok/s is its
      // tokens over its decode seconds of both.
      const settings = o.static.split(",").map((item) => item.split(":").map(Number));
      const runsOf = settings.map(() => []);
      for (const round of [0, 1]) {
        for (let k = 0; k < settings.length; k++) {
          const j = round === 0 ? k : settings.length - 1 - k;
          runsOf[j].push(...ledeRuns(file, prompts.tuning, threads, "static", settings[j]));
        }
      }
      settings.forEach((sd, j) => {
        const s = { exit_layer: sd[0], draft_len: sd[1], tok_s: tokS(runsOf[j]) };
        sweep.push(s);
        if (!best || s.tok_s > best.tok_s) best = s;
      });
      console.log(`static sweep on ${prompts.tuning.length} tuning prompts: ` +
                  sweep.map((s) => `E=${s.exit_layer} D=${s.draft_len} ${f1(s.tok_s)}`).join(", ") +
                  ` tok/s; best E=${best.exit_layer} D=${best.draft_len}`);
    }
    const llamaCppRuns = async (ps, lookup) => {
      const runs = [];
      for (const p of ps) runs.push(await llamaCppRun(model, p, threads, lookup));
      return runs;
    };
    const methods = [
      ["llamacpp_ar", (ps) => llamaCppRuns(ps, false)],
      ...(o.lookup ? [["llamacpp_prompt_lookup", (ps) => llamaCppRuns(ps, true)]] : []),
      ...(o.lede ? [["lede_ar", (ps) => ledeRuns(file, ps, threads, "ar")]] : []),
      ...(o.lede && best ? [["lede_static", (ps) => ledeRuns(file, ps, threads, "static", [best.exit_layer, best.draft_len])]] : []),
      ...(o.lede && o.policy ? [["lede_lede", (ps) => ledeRuns(file, ps, threads, "lede")]] : []),
    ];
    await llamaCppRun(model, prompts.eval[0], threads, false);  // warms llama.cpp's mapping of the file
    const prefill = o["prefill-tokens"] > 0 ? { text: prefillText(model, o["prefill-tokens"]), llamacpp: [], lede: [] }
      : null;
    if (prefill) {
      prefill.llamacpp_tokens = (await llamaCppPrefill(model, prefill.text, threads)).tokens;  // warm-up
      prefill.lede_tokens = o.lede ? ledeTokenCount(file, prefill.text) : null;
    }
    // Interleaved passes: each method on all held-out prompts, in turn.
    const passes = Object.fromEntries(methods.map(([m]) => [m, []]));
    const texts = {};
    let peerIds = [];  // llama.cpp's autoregressive token ids, first pass
    const extras = Object.fromEntries(methods.map(([m]) => [m, []]));
    for (let pass = 0; pass < o.repeats; pass++) {
      for (const [m, run] of methods) {
        const runs = await run(prompts.eval);
        passes[m].push(tokS(runs));
        if (pass === 0) texts[m] = runs.map((r) => r.text);
        if (pass === 0 && m === "llamacpp_ar") peerIds = runs.map((r) => r.ids);
        extras[m].push(...runs.map((r) => r.predictions || { acceptance_rate: r.acceptance }));
      }
      if (prefill) {
        prefill.llamacpp.push((await llamaCppPrefill(model, prefill.text, threads)).seconds);
        if (o.lede) prefill.lede.push(ledePrefill(file, prefill.text, threads));
      }
      console.log(`pass ${pass + 1}: ` + methods.map(([m]) => `${m} ${f1(passes[m][pass])}`).join(", ") + " tok/s" +
                  (prefill ? `; prefill llama.cpp ${f2(prefill.llamacpp[pass])} s` +
                             (o.lede ? `, ours ${f2(prefill.lede[pass])} s` : "") : ""));
    }
    // The text checks: llama.cpp's greedy text = ours on the file's weights
    // computed in f32 (the layout check) and = ours in the file's own
    // storage (q8_0 quantizes activations, so a near-tie may go the other
    // way); each speculative method = its engine's autoregressive text.
    const peerText = texts.llamacpp_ar;
    const reference = o.lede ? ledeRuns(file, prompts.eval, threads, "reference").map((r) => r.text) : [];
    // Both engines with attention in float32 (ours: float32 K/V, not
    // bfloat16; llama.cpp: llamaCppRun's f32Attention): what is left of the
    // differences without the caches' roundings.
    const oursF32Attention = o.lede ? ledeRuns(file, prompts.eval, threads, "f32_attention").map((r) => r.text) : [];
    const peerF32Attention = [];
    for (const p of o.lede ? prompts.eval : []) peerF32Attention.push(await llamaCppRun(model, p, threads, false, true));
    const count = (pred) => prompts.eval.filter((_, i) => pred(i)).length;
    // llama.cpp's first kFirstTokens tokens, as text, within ours.
    const peerFirst = peerIds.map((ids) => model.detokenize(ids.slice(0, kFirstTokens)));
    const divergences = [];
    if (o.lede) {
      for (const [i, p] of prompts.eval.entries()) {
        if (texts.lede_ar[i].includes(peerText[i])) continue;
        const d = await divergence(model, p, texts.lede_ar[i], threads);
        if (d) divergences.push({ prompt: i, ...d });
      }
    }
    const checks = {
      prompts: prompts.eval.length,
      same_greedy_text_f32_compute: o.lede ? count((i) => reference[i].includes(peerText[i])) : null,
      same_greedy_text_native: o.lede ? count((i) => texts.lede_ar[i].includes(peerText[i])) : null,
      first_tokens: kFirstTokens,
      same_first_tokens_f32_compute: o.lede ? count((i) => reference[i].includes(peerFirst[i])) : null,
      same_first_tokens_native: o.lede ? count((i) => texts.lede_ar[i].includes(peerFirst[i])) : null,
      same_greedy_text_f32_attention: o.lede ? count((i) => oursF32Attention[i].includes(peerF32Attention[i].text))
        : null,
      same_first_tokens_f32_attention: o.lede ? count((i) => oursF32Attention[i].includes(
        model.detokenize(peerF32Attention[i].ids.slice(0, kFirstTokens)))) : null,
      // Per prompt whose native text differs: llama.cpp's probability of its own token and of ours
      // at the first step where they differ.
      divergences: o.lede ? divergences : null,
      llamacpp_lookup_lossless: o.lookup ? count((i) => texts.llamacpp_prompt_lookup[i] === peerText[i]) : null,
      lede_static_lossless: texts.lede_static ? count((i) => texts.lede_static[i] === texts.lede_ar[i]) : null,
      lede_lede_lossless: texts.lede_lede ? count((i) => texts.lede_lede[i] === texts.lede_ar[i]) : null,
    };
    const ceiling = o.ceiling && o.lede ? speculationCeiling(file, threads) : null;
    measureRoofline(`after ${format}, ${threads} thread(s)`);
    const roof = bestRoofline();
    const rows = {};
    for (const [m] of methods) {
      const s = spread(passes[m]);
      const autoregressive = m === "llamacpp_ar" || m === "lede_ar";
      rows[m] = {
        tok_s_per_pass: passes[m], median_tok_s: s.median, min_tok_s: s.min, max_tok_s: s.max,
        // Per pass: this method's tok/s over llama.cpp autoregressive's in the same pass.
        vs_llamacpp_ar: spread(passes[m].map((v, p) => v / passes.llamacpp_ar[p])),
        ...(autoregressive && perToken ? { effective_gb_s: perToken * s.median / 1e9 } : {}),
        ...(autoregressive && perToken && roof ? { share_of_roofline: perToken * s.median / 1e9 / roof } : {}),
        ...(m === "lede_static" ? { exit_layer: best.exit_layer, draft_len: best.draft_len, sweep,
                                    sweep_prompts: prompts.tuning.length } : {}),
        ...(m === "lede_lede" ? { policy: o.policy } : {}),
        ...(m === "lede_static" || m === "lede_lede" ? {
          mean_acceptance_rate: extras[m].reduce((a, e) => a + e.acceptance_rate, 0) / extras[m].length } : {}),
        ...(m === "llamacpp_prompt_lookup" ? {
          predictor: "InputLookupTokenPredictor (defaults)",
          predictions: extras[m].reduce((a, p) => ({ validated: a.validated + (p?.validated || 0),
                                                      refuted: a.refuted + (p?.refuted || 0) }),
                                        { validated: 0, refuted: 0 }) } : {}),
        ...(m.startsWith("lede_") ? { engine_weights: "--weights auto (the file's storage)" } : {}),
      };
    }
    const prefillRow = prefill ? {
      llamacpp_tokens: prefill.llamacpp_tokens, lede_tokens: prefill.lede_tokens,
      llamacpp_s_per_pass: prefill.llamacpp, lede_s_per_pass: prefill.lede,
      llamacpp_s: spread(prefill.llamacpp), lede_s: o.lede ? spread(prefill.lede) : null,
      // Per pass: our prefill seconds over llama.cpp's in the same pass (< 1: ours is faster).
      lede_over_llamacpp: o.lede ? spread(prefill.lede.map((v, p) => v / prefill.llamacpp[p])) : null,
    } : undefined;
    results.push({ format, threads, file: path.basename(file), bytes, bytes_per_token: perToken,
                   methods: rows, checks, llamacpp_texts: peerText, ...(prefillRow ? { prefill: prefillRow } : {}),
                   ...(ceiling ? { speculation_ceiling: ceiling } : {}) });
    if (ceiling) {
      const b = ceiling.best;
      console.log(`${format.padEnd(5)} threads ${threads} speculation ceiling (every draft accepted): ` +
                  `${f2(b.speedup)}x our autoregressive at E=${b.exit_layer} K=${b.draft_len}; a verification of ` +
                  `1..7 positions costs ${ceiling.verify_over_step.map(f2).join(", ")} of one`);
    }
    if (prefillRow) {
      console.log(`${format.padEnd(5)} threads ${threads} prefill of ${prefillRow.llamacpp_tokens} tokens: llama.cpp ` +
                  `${f2(prefillRow.llamacpp_s.median)} s (${f2(prefillRow.llamacpp_s.min)}-${f2(prefillRow.llamacpp_s.max)})` +
                  (o.lede ? `, ours ${f2(prefillRow.lede_s.median)} s (${f2(prefillRow.lede_s.min)}-` +
                            `${f2(prefillRow.lede_s.max)}; ${prefillRow.lede_tokens} tokens), ours / llama.cpp ` +
                            `${f2(prefillRow.lede_over_llamacpp.median)}` : ""));
    }
    for (const [m] of methods) {
      const r = rows[m];
      console.log(`${format.padEnd(5)} threads ${threads} ${m.padEnd(23)} ${f1(r.median_tok_s).padStart(7)} tok/s ` +
                  `(${f1(r.min_tok_s)}-${f1(r.max_tok_s)}), ${f2(r.vs_llamacpp_ar.median)}x llama.cpp AR ` +
                  `(${f2(r.vs_llamacpp_ar.min)}-${f2(r.vs_llamacpp_ar.max)})` +
                  (r.effective_gb_s != null ? `, ${f1(r.effective_gb_s)} GB/s` : "") +
                  (r.share_of_roofline != null ? ` = ${(100 * r.share_of_roofline).toFixed(0)}% of the read roofline` : "") +
                  (m === "lede_static" ? ` [E=${r.exit_layer} D=${r.draft_len}]` : ""));
    }
    console.log(`checks (of ${checks.prompts} prompts): same greedy text as llama.cpp: f32 compute ` +
                `${checks.same_greedy_text_f32_compute}, native ${checks.same_greedy_text_native}; first ` +
                `${kFirstTokens} tokens: f32 compute ${checks.same_first_tokens_f32_compute}, native ` +
                `${checks.same_first_tokens_native}; both with float32 attention: ${checks.same_greedy_text_f32_attention} ` +
                `(first ${kFirstTokens}: ${checks.same_first_tokens_f32_attention}); lossless: ` +
                `llama.cpp lookup ${checks.llamacpp_lookup_lossless}, our static ${checks.lede_static_lossless}, ` +
                `our LEDE ${checks.lede_lede_lossless}`);
    for (const d of divergences) {
      console.log(`  prompt ${d.prompt}: token ${d.token_index}: llama.cpp ${JSON.stringify(d.llamacpp_token)} ` +
                  `p=${d.llamacpp_p.toFixed(4)}, ours ${JSON.stringify(d.ours_token)} p=${d.ours_p_under_llamacpp.toFixed(4)}`);
    }
  }
  await model.dispose();
}
measureRoofline("after the runs");
// The GB/s shares against the best read bandwidth measured.
for (const row of results) {
  for (const m of Object.values(row.methods)) {
    if (m.effective_gb_s != null && bestRoofline()) m.share_of_roofline = m.effective_gb_s / bestRoofline();
  }
}

const date = new Date().toISOString();
const report = {
  benchmark: "llamacpp_bench",
  command: ["node", ...process.argv.slice(1)].join(" "),
  commit: commit + (dirty ? "-dirty" : ""), date,
  machine: { cpu: os.cpus()[0]?.model, cores: os.cpus().length, memory_bytes: os.totalmem(),
             os: `${os.type()} ${os.release()}`, node: process.version,
             load_average_1m: { before: loadBefore[0], after: os.loadavg()[0] } },
  peer: { package: "node-llama-cpp", version: nlcVersion, gpu: false, build: "never" },
  roofline: { source: o.roofline ? `${o.roofline} --roofline-only (one core; the best of these measurements)` : null,
              measurements: rooflines, used_gb_per_s: bestRoofline() },
  settings: { tokens: o.tokens, repeats: o.repeats, greedy: true, prompts: prompts.source,
              eval_prompts: prompts.eval, tuning_prompts: prompts.tuning, static_sweep: o.static, policy: o.policy,
              ceiling: Boolean(o.ceiling),
              prefill_tokens: o["prefill-tokens"],
              timed: "decode only: llama.cpp from the first generated token to the last; ours lede generate's " +
                     "decode tokens/s of the second of two generations per process; tok/s of a pass = its tokens " +
                     "over its decode seconds on all held-out prompts" },
  results,
};
const out = o.out || path.join("bench", "results", `llamacpp-${date.slice(0, 10)}.json`);
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, JSON.stringify(report, null, 2) + "\n");
console.log(`wrote ${out}`);
fs.rmSync(workDir, { recursive: true, force: true });
