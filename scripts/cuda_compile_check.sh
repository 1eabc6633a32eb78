#!/usr/bin/env bash
# Compiles (syntax and types, no link) the engine's CUDA-only code on a
# machine without CUDA, with LEDE_WITH_CUDA=1: shared/model/step_graphs.cc
# (the CUDA graph capture and replay of the decode steps) and
# shared/model/kv_cache.cc (the KV pool shared through CUDA IPC), against
# this machine's libtorch headers and the CUDA 11.8 headers of Debian's
# non-free nvidia-cuda-dev package. The package (774 MB) is
# fetched once with apt-get download through a private apt state (the
# system's sources and lists are not touched) and only its headers are
# unpacked, into $CUDA_CACHE (default ~/.cache/lede-cuda). With CUDA_INCLUDE
# set to a CUDA include directory nothing is downloaded.
# Debian's CPU libtorch lacks the one generated header of c10/cuda
# (c10/cuda/impl/cuda_cmake_macros.h); the check supplies it with the value a
# shared-library build generates.
# This proves the code compiles against the headers here, not that it runs:
# scripts/gpu_check.sh on a CUDA machine does that.
# Exit status: 0 when every file compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${CUDA_CACHE:-$HOME/.cache/lede-cuda}
mkdir -p "$cache"
if [[ -z ${CUDA_INCLUDE:-} ]]; then
  CUDA_INCLUDE=$cache/root/usr/include
  if [[ ! -f $CUDA_INCLUDE/cuda_runtime_api.h ]]; then
    apt_dir=$cache/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
    echo "deb http://deb.debian.org/debian bookworm non-free" > "$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir" -o "Dir::Cache::archives=$apt_dir/archives")
    apt-get "${apt_opts[@]}" update -qq
    (cd "$apt_dir" && apt-get "${apt_opts[@]}" download nvidia-cuda-dev)
    mkdir -p "$cache/root"
    dpkg-deb --fsys-tarfile "$apt_dir"/nvidia-cuda-dev_*.deb | tar -x -C "$cache/root" --wildcards './usr/include/*'
    rm -f "$apt_dir"/nvidia-cuda-dev_*.deb
  fi
fi
stub=$cache/stub
mkdir -p "$stub/c10/cuda/impl"
[[ -f /usr/include/c10/cuda/impl/cuda_cmake_macros.h ]] ||
  echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$stub/c10/cuda/impl/cuda_cmake_macros.h"
files=(shared/model/step_graphs.cc shared/model/kv_cache.cc)
for f in "${files[@]}"; do
  g++ -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Werror -DLEDE_WITH_CUDA=1 \
    -I. -isystem /usr/include/torch/csrc/api/include -isystem "$CUDA_INCLUDE" -isystem "$stub" "$f"
  echo "cuda_compile_check: $f compiles with LEDE_WITH_CUDA=1"
done
