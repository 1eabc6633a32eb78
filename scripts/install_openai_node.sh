#!/usr/bin/env bash
# Installs the official `openai` npm package (the OpenAI API's Node.js
# client) for the coordinator's OpenAI-compatible API tests, which run real
# client code under node against a local deployment. Idempotent: does
# nothing when the pinned version is installed. Needs npm (Node.js) the
# first time only; the installed package runs offline.
#
#   LEDE_TOOLS_DIR  install prefix (default /opt/lede-tools); the package
#                   goes to $LEDE_TOOLS_DIR/openai-node/node_modules/openai
#
# Prints the node_modules directory; the tests look for it at
# $LEDE_OPENAI_NODE_MODULES, else /opt/lede-tools/openai-node/node_modules.
set -euo pipefail

version=6.49.0  # no runtime dependencies; runs on Node.js 20
prefix="${LEDE_TOOLS_DIR:-/opt/lede-tools}/openai-node"
pkg="$prefix/node_modules/openai/package.json"

if [[ -f "$pkg" ]] && grep -q "\"version\": \"$version\"" "$pkg"; then
  echo "$prefix/node_modules"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install_openai_node: npm not found; install Node.js (apt-get install nodejs npm) to run the OpenAI client tests" >&2
  exit 1
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "openai@$version" >&2
echo "$prefix/node_modules"
