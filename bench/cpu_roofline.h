// File: bench/cpu_roofline.h
//
// What this CPU can do, measured for the engine benchmark (engine_bench.cc,
// sections 1 and 1b of its file comment): the read bandwidth of DRAM and of
// the last-level cache, the GFLOP/s of OpenBLAS sgemm, and the
// matrix-vector kernels (cpu_kernels.h) against OpenBLAS; with the timing
// helpers the benchmark shares. Everything runs on the calling thread (sgemm
// on libtorch's threads, as the engine does). GB = 1e9 bytes.
#ifndef LEDE_BENCH_CPU_ROOFLINE_H_
#define LEDE_BENCH_CPU_ROOFLINE_H_

#include <chrono>
#include <cstdint>
#include <vector>

namespace lede::bench {

// The upper median of `v` (v[n / 2] once sorted); 0 for an empty `v`.
double Median(std::vector<double> v);

// Wall-clock seconds of one call of f() (steady clock).
template <typename F>
double Seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds this thread has run (CLOCK_THREAD_CPUTIME_ID): unlike wall
// time, not counting the time other processes held the core.
double ThreadCpuSeconds();

// GB/s of summing a buffer of `bytes` (read only), median of `reps` passes
// after one that faults the pages in; *per_cpu_s (optional): the same per
// second of this thread's CPU time.
double ReadBandwidthGbs(int64_t bytes, int reps, double* per_cpu_s = nullptr);

// GFLOP/s of an n x n x n sgemm (cpu::MatMulNT), median of `reps` runs
// after a warm-up.
double SgemmGflops(int64_t n, int reps);

// Prints ns per call of the matrix-vector and few-row products of the
// models' shapes: the vectorized loop, the packed layout and OpenBLAS.
void PrintGemvTable();

}  // namespace lede::bench

#endif  // LEDE_BENCH_CPU_ROOFLINE_H_
