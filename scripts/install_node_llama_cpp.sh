#!/usr/bin/env bash
# Installs npm's `node-llama-cpp` (llama.cpp's Node.js binding) with its
# prebuilt CPU binary for Linux x64 (@node-llama-cpp/linux-x64), for the
# llama.cpp peer benchmark bench/llamacpp_bench.mjs. Idempotent: does nothing
# when the pinned version is installed. Needs npm the first time only; the
# installed package runs offline: the benchmark calls
# getLlama({gpu: false, build: "never"}), which neither downloads nor builds.
# The CUDA/Vulkan/ARM variants (optional dependencies, ~700 MB) are left out.
#
#   LEDE_TOOLS_DIR  install prefix (default /opt/lede-tools); the package
#                   goes to $LEDE_TOOLS_DIR/node-llama-cpp/node_modules
#
# Prints the node_modules directory; the benchmark looks for it at
# $LEDE_NODE_LLAMA_CPP_MODULES, else /opt/lede-tools/node-llama-cpp/node_modules.
set -euo pipefail

version=3.22.1
prefix="${LEDE_TOOLS_DIR:-/opt/lede-tools}/node-llama-cpp"
pkg="$prefix/node_modules/node-llama-cpp/package.json"
bin="$prefix/node_modules/@node-llama-cpp/linux-x64/package.json"

if [[ -f "$pkg" && -f "$bin" ]] && grep -q "\"version\": \"$version\"" "$pkg"; then
  echo "$prefix/node_modules"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install_node_llama_cpp: npm not found; install Node.js (apt-get install nodejs npm)" >&2
  exit 1
fi
mkdir -p "$prefix"
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
  --omit=optional "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >&2
echo "$prefix/node_modules"
