// A kernel driver for the fused ggml block products (cpu_ggml_kernels.h)
// and, for comparison, the packed q8_0 and bf16 products (cpu_quant_kernels.h): one
// [out, in] weight matrix against n rows of X, `reps` times.
//
// Meant to run under `valgrind --tool=callgrind
// --toggle-collect='lede::model::cpu::MatMulRows*'` so that instructions
// per weight (Ir / (reps * out * in)) can be counted on a loaded machine
// where wall-clock is noise; it also prints wall-clock ns per weight.
//
// Usage: lede_ggml_kernel_bench TYPE [n=1] [out=4096] [in=1536] [reps=20]
//   TYPE: q4_0 q5_0 q8_0 q4_k q5_k q6_k (GgmlMatrix), packed_q8_0, packed_bf16.
// Prints one JSON line: type, n, out, in, reps, ns_per_weight.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shared/model/cpu/cpu_ggml_kernels.h"
#include "shared/model/cpu/cpu_quant_kernels.h"

namespace {

using lede::checkpoint::GgmlType;
namespace cpu = lede::model::cpu;

bool ParseType(const std::string& s, GgmlType* t) {
  const struct { const char* name; GgmlType type; } kNames[] = {
      {"q4_0", GgmlType::kQ4_0}, {"q5_0", GgmlType::kQ5_0}, {"q8_0", GgmlType::kQ8_0},
      {"q4_k", GgmlType::kQ4_K}, {"q5_k", GgmlType::kQ5_K}, {"q6_k", GgmlType::kQ6_K}};
  for (const auto& e : kNames) {
    if (s == e.name) return *t = e.type, true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TYPE [n] [out] [in] [reps]\n", argv[0]);
    return 2;
  }
  const std::string type_name = argv[1];
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 1;
  const int64_t out = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int64_t in = argc > 4 ? std::atoll(argv[4]) : 1536;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 20;
  if (n <= 0 || out <= 0 || in <= 0 || in % 256 != 0 || reps <= 0) {
    std::fprintf(stderr, "n, out, reps must be positive and in a positive multiple of 256\n");
    return 2;
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(out * in)), x(static_cast<size_t>(n * in)),
      y(static_cast<size_t>(n * out));
  for (float& v : w) v = normal(rng);
  for (float& v : x) v = normal(rng) * 20.0f;

  cpu::GgmlMatrix gm(in);
  std::vector<uint8_t> packed;
  std::vector<uint16_t> packed_bf16;
  const bool packed_q8 = type_name == "packed_q8_0", bf16 = type_name == "packed_bf16";
  if (bf16) {
    packed_bf16.resize(static_cast<size_t>(cpu::PackedRowsPadded(out) * in));
    cpu::PackRowsBf16(w.data(), out, in, packed_bf16.data());
  } else if (packed_q8) {
    std::vector<cpu::BlockQ8_0> blocks(static_cast<size_t>(out * in / cpu::kQ8Block));
    cpu::QuantizeRowsQ8_0(w.data(), out, in, blocks.data());
    packed.resize(cpu::PackedQ8_0Bytes(out, in));
    cpu::PackRowsQ8_0(blocks.data(), out, in, packed.data());
  } else {
    GgmlType t;
    if (!ParseType(type_name, &t)) {
      std::fprintf(stderr, "unknown TYPE %s\n", type_name.c_str());
      return 2;
    }
    gm.AppendQuantized(t, w.data(), out);
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    if (bf16) {
      cpu::MatMulRowsPackedBf16(x.data(), n, in, packed_bf16.data(), out, y.data(), out, false);
    } else if (packed_q8) {
      cpu::MatMulRowsPackedQ8_0(x.data(), n, in, packed.data(), out, y.data(), out, false);
    } else {
      cpu::MatMulRowsGgml(x.data(), n, in, gm, 0, out, y.data(), out, false);
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  double check = 0;
  for (float v : y) check += v;
  std::printf("{\"type\": \"%s\", \"n\": %lld, \"out\": %lld, \"in\": %lld, \"reps\": %d, \"ns_per_weight\": %.4f, "
              "\"checksum\": %.6g}\n",
              type_name.c_str(), static_cast<long long>(n), static_cast<long long>(out), static_cast<long long>(in),
              reps, ns / (static_cast<double>(reps) * out * in), check);
  return 0;
}
