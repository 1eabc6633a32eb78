// Runs the JavaScript implementation of Hugging Face tokenizers
// (@huggingface/tokenizers) as the oracle of hf_tokenizer_test.cc.
//
//   node hf_tokenizer_oracle.mjs NODE_MODULES TOKENIZER_JSON TOKENIZER_CONFIG CASES_JSON
//
// CASES_JSON is a JSON list of strings. Prints one JSON object per case on
// its own line: {"plain": ids without special tokens, "special": ids with
// the post-processor's special tokens, "decoded": decode(plain,
// skip_special_tokens)}.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [modules, tokenizerJson, tokenizerConfig, casesJson] = process.argv.slice(2);
const entry = path.join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs");
const { Tokenizer } = await import(pathToFileURL(entry).href);
const config = tokenizerConfig === "-" ? {} : JSON.parse(readFileSync(tokenizerConfig, "utf8"));
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerJson, "utf8")), config);
const cases = JSON.parse(readFileSync(casesJson, "utf8"));
const lines = [];
for (const text of cases) {
  const plain = tokenizer.encode(text, { add_special_tokens: false }).ids;
  const special = tokenizer.encode(text, { add_special_tokens: true }).ids;
  const decoded = plain.length === 0 ? "" : tokenizer.decode(plain, { skip_special_tokens: true });
  lines.push(JSON.stringify({ plain, special, decoded }));
}
process.stdout.write(lines.join("\n") + "\n");
