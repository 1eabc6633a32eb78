#!/usr/bin/env bash
# Installs s3rver (a small S3-compatible server in Node.js) for the storage
# and experience tests that talk to a real S3 endpoint on loopback. Idempotent:
# does nothing when it is already installed. Needs npm (Node.js) the first
# time only; the installed server runs offline.
#
#   LEDE_TOOLS_DIR  install prefix (default /opt/lede-tools)
#
# Prints the path of the s3rver executable; the tests look for it at
# $LEDE_S3RVER, else /opt/lede-tools/node_modules/.bin/s3rver.
set -euo pipefail

version=3.7.1
prefix="${LEDE_TOOLS_DIR:-/opt/lede-tools}"
bin="$prefix/node_modules/.bin/s3rver"
pkg="$prefix/node_modules/s3rver/package.json"

if [[ -x "$bin" && -f "$pkg" ]] && grep -q "\"version\": \"$version\"" "$pkg"; then
  echo "$bin"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install_s3rver: npm not found; install Node.js (apt-get install nodejs npm) to run the S3 tests" >&2
  exit 1
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "s3rver@$version" >&2
echo "$bin"
