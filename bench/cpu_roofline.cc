// File: bench/cpu_roofline.cc
//
// The CPU's roofline and kernel tables of the engine benchmark (contracts
// in cpu_roofline.h).
#include "bench/cpu_roofline.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "shared/model/cpu/cpu_kernels.h"

namespace lede::bench {

namespace cpu = lede::model::cpu;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double ReadBandwidthGbs(int64_t bytes, int reps, double* per_cpu_s) {
  const int64_t n = bytes / 4;
  std::vector<float> a(n, 1.0f), ones(8192, 1.0f);
  volatile float sink = 0;
  std::vector<double> t, c;
  for (int r = 0; r < reps + 1; ++r) {
    const double c0 = ThreadCpuSeconds();
    const double s = Seconds([&] {
      float acc = 0;
      for (int64_t i = 0; i < n; i += 8192) acc += cpu::Dot(a.data() + i, ones.data(), std::min<int64_t>(8192, n - i));
      sink = sink + acc;
    });
    if (r > 0) t.push_back(s), c.push_back(ThreadCpuSeconds() - c0);  // the first pass faults the pages in
  }
  if (per_cpu_s != nullptr) *per_cpu_s = bytes / Median(c) / 1e9;
  return bytes / Median(t) / 1e9;
}

double SgemmGflops(int64_t n, int reps) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    const double s = Seconds([&] { cpu::MatMulNT(a.data(), n, n, b.data(), n, c.data(), false); });
    if (r > 0) t.push_back(s);
  }
  return 2.0 * n * n * n / Median(t) / 1e9;
}

void PrintGemvTable() {
  std::printf("\nmatrix-vector [out x in], one row: ns per call (loop over row-major W, over W in\n"
              "the packed layout (cpu::PackRows; - where in %% 8 != 0), cblas_sgemv)\n");
  std::printf("%12s %10s %10s %10s\n", "shape", "loop", "packed", "sgemv");
  for (auto [out, in] : {std::pair<int64_t, int64_t>{128, 64}, {344, 64}, {64, 172}, {512, 64},
                         {320, 192}, {1024, 192}, {192, 512}, {2048, 192}}) {
    std::vector<float> w(out * in, 0.01f), x(in, 1.0f), y(out);
    const int iters = static_cast<int>(std::max<int64_t>(200, 20000000 / (out * in)));
    auto time = [&](auto&& f) {
      std::vector<double> t;
      for (int r = 0; r < 5; ++r) t.push_back(Seconds([&] { for (int i = 0; i < iters; ++i) f(); }) / iters);
      return Median(t) * 1e9;
    };
    const double loop = time([&] { cpu::MatVec(w.data(), out, in, x.data(), y.data(), false); });
    const double blas = time([&] { cpu::MatVecBlas(w.data(), out, in, x.data(), y.data(), false); });
    char shape[48], packed[16] = "-";
    if (cpu::Packable(in)) {
      std::vector<float> p(out * in);
      cpu::PackRows(w.data(), out, in, p.data());
      std::snprintf(packed, sizeof(packed), "%.0f", time([&] {
        cpu::MatMulRowsPacked(x.data(), 1, in, p.data(), out, y.data(), out, false);
      }));
    }
    std::snprintf(shape, sizeof(shape), "%lldx%lld", static_cast<long long>(out), static_cast<long long>(in));
    std::printf("%12s %10.0f %10s %10.0f\n", shape, loop, packed, blas);
  }
  // Few rows (drafts, verification): MatMulRows against cblas_sgemm, which
  // repacks W on every call.
  std::printf("n rows x [1024 x 192]: ns per call (MatMulRows over row-major W, over packed W,\n"
              "cblas_sgemm)\n");
  std::printf("%12s %10s %10s %10s\n", "n", "rows", "packed", "sgemm");
  const int64_t out = 1024, in = 192;
  std::vector<float> w(out * in, 0.01f), x(64 * in, 1.0f), y(64 * out), p(out * in);
  cpu::PackRows(w.data(), out, in, p.data());
  for (int64_t n : {2, 5, 9, 17, 24, 32, 64}) {
    auto time = [&](auto&& f) {
      std::vector<double> t;
      for (int r = 0; r < 5; ++r) t.push_back(Seconds([&] { for (int i = 0; i < 200; ++i) f(); }) / 200);
      return Median(t) * 1e9;
    };
    const double rows = time([&] { cpu::MatMulRows(x.data(), n, in, w.data(), out, y.data(), false); });
    const double packed =
        time([&] { cpu::MatMulRowsPacked(x.data(), n, in, p.data(), out, y.data(), out, false); });
    const double blas = time([&] { cpu::MatMulBlas(x.data(), n, in, w.data(), out, y.data(), false); });
    std::printf("%12lld %10.0f %10.0f %10.0f\n", static_cast<long long>(n), rows, packed, blas);
  }
}

}  // namespace lede::bench
