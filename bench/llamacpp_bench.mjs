#!/usr/bin/env node
// The llama.cpp peer benchmark (issue 35): llama.cpp (npm `node-llama-cpp`,
// its prebuilt CPU binary, getLlama({gpu: false, build: "never"}): nothing is
// downloaded or built at run time) and this engine decode the same GGUF
// files greedily, autoregressively, and the benchmark prints each one's
// decode tok/s per weight format and thread count, and whether the two
// engines produced the same text. Results go to a JSON file (command,
// commit, date, machine) under bench/results/.
//
// usage: node bench/llamacpp_bench.mjs --model DIR [--formats f32,bf16,q8_0]
//          [--threads 1,2] [--tokens 96] [--repeats 3] [--prompt TEXT]
//          [--lede build/services/cli/lede] [--static 2,3] [--policy DIR]
//          [--out bench/results/FILE.json]
//        node bench/llamacpp_bench.mjs --gguf FILE.gguf[,FILE2.gguf] ...
//   --model DIR   a checkpoint: exported once per format with
//                 `lede export --format gguf --weights FORMAT` into a
//                 temporary directory
//   --gguf FILES  GGUF files to run as they are (format read from the name)
//   --lede BIN    this engine's CLI; "" to run llama.cpp alone
//   --static E,D  also this engine's static self-speculation (default 2,3; "" = off)
//   --policy DIR  also LEDE with this policy (default: MODEL/policy with --model)
// Needs scripts/install_node_llama_cpp.sh (LEDE_NODE_LLAMA_CPP_MODULES, else
// /opt/lede-tools/node-llama-cpp/node_modules).
//
// What is timed: llama.cpp: from the first generated token to the last
// (tokens - 1 decode steps, the prompt's evaluation excluded); this engine:
// `lede generate`'s own tokens/s (decode only), with --weights auto (the
// file's storage: bf16 or q8_0 kernels). The text check runs
// `lede generate --weights f32` (the file's weights, dequantized).
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
  const o = {
    model: "", gguf: "", formats: "f32,bf16,q8_0", threads: "1,2", tokens: 96, repeats: 3,
    prompt: "Once upon a time, there was a little", lede: "build/services/cli/lede", out: "",
    static: "2,3", policy: "",
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
  if (!o.policy && o.model && fs.existsSync(path.join(o.model, "policy"))) o.policy = path.join(o.model, "policy");
  if (!o.model && !o.gguf) {
    console.error("llamacpp_bench: --model DIR or --gguf FILES is required");
    process.exit(2);
  }
  return o;
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : null;
}

function sh(cmd, args) {
  try {
    return execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }).trim();
  } catch {
    return "";
  }
}

const o = parseArgs(process.argv.slice(2));
const modules = process.env.LEDE_NODE_LLAMA_CPP_MODULES || "/opt/lede-tools/node-llama-cpp/node_modules";
const entry = path.join(modules, "node-llama-cpp", "dist", "index.js");
if (!fs.existsSync(entry)) {
  console.error(`llamacpp_bench: ${entry} not found; run scripts/install_node_llama_cpp.sh`);
  process.exit(1);
}
const { getLlama } = await import(pathToFileURL(entry).href);
const nlcVersion = JSON.parse(fs.readFileSync(path.join(modules, "node-llama-cpp", "package.json"), "utf8")).version;

// The GGUF files: given, or exported from --model once per format.
let files = [];
let exportDir = "";
if (o.gguf) {
  files = o.gguf.split(",").map((f) => ({ file: f, format: (f.match(/(f32|f16|bf16|q8_0)/) || ["", "?"])[1] }));
} else {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "lede-llamacpp-bench-"));
  exportDir = dir;
  for (const format of o.formats.split(",")) {
    const file = path.join(dir, `${path.basename(path.resolve(o.model))}-${format}.gguf`);
    execFileSync(o.lede, ["export", "--format", "gguf", "--weights", format, "--model", o.model, "--out", file],
                 { stdio: ["ignore", "ignore", "inherit"] });
    files.push({ file, format });
  }
}
const threadCounts = o.threads.split(",").map(Number);

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });

async function runLlamaCpp(file, threads) {
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  const ids = [model.tokens.bos, ...model.tokenize(o.prompt, false)];
  const runs = [];
  let text = "";
  for (let r = 0; r < o.repeats + 1; r++) {  // the first run warms up and is not counted
    const ctx = await model.createContext({ contextSize: ids.length + o.tokens + 8, threads, batchSize: 512 });
    const seq = ctx.getSequence();
    const out = [];
    let t1 = 0;
    for await (const tok of seq.evaluate(ids, { temperature: 0 })) {
      if (out.length === 0) t1 = performance.now();
      out.push(tok);
      if (out.length >= o.tokens) break;
    }
    const seconds = (performance.now() - t1) / 1000;
    if (r > 0) runs.push((out.length - 1) / seconds);
    text = model.detokenize(out);
    await ctx.dispose();
  }
  await model.dispose();
  return { tok_s: runs, median_tok_s: median(runs), text };
}

// This engine on the same file: `lede generate` in `mode` (ar, static E,D or
// lede with the checkpoint's policy), its own decode tokens/s per run.
function runLede(file, threads, mode) {
  if (!o.lede) return null;
  const extra = [];
  if (mode === "static") {
    const [e, d] = o.static.split(",");
    extra.push("--exit-layer", e, "--draft-len", d);
  }
  if (mode === "lede") extra.push("--policy", o.policy);
  if (mode === "reference") {  // the file's weights dequantized, computed in f32: the text check
    mode = "ar";
    extra.push("--weights", "f32");
  }
  const r = spawnSync(o.lede, ["generate", "--model", file, "--prompt", o.prompt, "--mode", mode,
                               "--max-new-tokens", String(o.tokens), "--threads", String(threads),
                               "--repeat", String(o.repeats + 1), ...extra], { encoding: "utf8" });
  if (r.status !== 0) return { error: `lede generate exited ${r.status}: ${(r.stderr || "").trim().split("\n").pop()}` };
  // The text on stdout, one "[mode] N tokens, X tokens/s" line per run on stderr.
  const rates = [...r.stderr.matchAll(/^\[[^\]]+\] \d+ tokens, ([0-9.]+) tokens\/s/gm)].map((m) => Number(m[1]));
  return { tok_s: rates.slice(1), median_tok_s: median(rates.slice(1)), text: r.stdout };
}

const loadBefore = os.loadavg();
const results = [];
for (const { file, format } of files) {
  const bytes = fs.statSync(file).size;
  for (const threads of threadCounts) {
    const peer = await runLlamaCpp(file, threads);
    const ours = {};
    const modes = ["ar", ...(o.static ? ["static"] : []), ...(o.policy ? ["lede"] : [])];
    for (const mode of modes) {
      try {
        ours[mode] = runLede(file, threads, mode);
      } catch (e) {
        ours[mode] = { error: String(e.message || e).split("\n")[0] };
      }
    }
    let reference = null;
    try {
      reference = runLede(file, threads, "reference");
    } catch (e) {
      reference = { error: String(e.message || e).split("\n")[0] };
    }
    const ar = ours.ar;
    const same = reference && reference.text !== undefined ? reference.text.includes(peer.text) : null;
    const sameNative = ar && ar.text !== undefined ? ar.text.includes(peer.text) : null;
    const row = {
      format, threads, file: path.basename(file), bytes,
      llamacpp: { tok_s: peer.tok_s, median_tok_s: peer.median_tok_s },
      lede: Object.fromEntries(Object.entries(ours).map(([m, v]) => [m, v && !v.error ? {
        tok_s: v.tok_s, median_tok_s: v.median_tok_s, engine_weights: "--weights auto (the file's storage)",
        ...(m === "static" ? { exit_layer_draft_len: o.static } : {}), ...(m === "lede" ? { policy: o.policy } : {}),
      } : v])),
      // llama.cpp's greedy text = ours on the file's weights computed in f32
      // (--weights f32: the layout check), and = ours in the file's own
      // storage (--weights auto: q8_0 quantizes activations, so a near-tie
      // may go the other way).
      same_greedy_text: same,
      same_greedy_text_native: sameNative,
      llamacpp_text: peer.text,
    };
    results.push(row);
    const f = (x) => (x == null ? "-" : x.toFixed(1));
    const ledeCols = Object.entries(row.lede).map(([m, v]) => `lede ${m} ${f(v && v.median_tok_s)}`).join(", ");
    console.log(`${format.padEnd(5)} threads ${threads}: llama.cpp ${f(peer.median_tok_s)} tok/s, ${ledeCols} tok/s, ` +
                `same greedy text as llama.cpp: f32 compute ${same}, native ${sameNative}`);
  }
}

const commit = sh("git", ["rev-parse", "HEAD"]);
const date = new Date().toISOString();
const report = {
  benchmark: "llamacpp_bench",
  command: ["node", ...process.argv.slice(1)].join(" "),
  commit, date,
  machine: { cpu: os.cpus()[0]?.model, cores: os.cpus().length, memory_bytes: os.totalmem(),
             os: `${os.type()} ${os.release()}`, node: process.version,
             load_average_1m: { before: loadBefore[0], after: os.loadavg()[0] } },
  peer: { package: "node-llama-cpp", version: nlcVersion, gpu: false, build: "never" },
  settings: { tokens: o.tokens, repeats: o.repeats, prompt: o.prompt, greedy: true,
              timed: "decode only: from the first generated token to the last; first run of each is a warm-up" },
  results,
};
const out = o.out || path.join("bench", "results", `llamacpp-${date.slice(0, 10)}.json`);
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, JSON.stringify(report, null, 2) + "\n");
console.log(`wrote ${out}`);
if (exportDir) fs.rmSync(exportDir, { recursive: true, force: true });
