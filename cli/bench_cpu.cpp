#include "bench_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#if defined(MOE_EP_HAVE_OPENBLAS)
#include <cblas.h>
#endif

#include "moe_ep/formats.h"
#include "moe_ep/status.h"
#include "moe_ep/weight_prep.h"
#include "problem.h"

namespace moe_ep::cli {
namespace {

std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* f = popen(cmd, "r")) {
    char buf[256];
    if (fgets(buf, sizeof buf, f)) out = buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// OpenBLAS sgemm over the same grouped, dequantized problem: per touched expert
// [n, H] x [H, 2I], the activation, then [n, I] x [I, H]. Returns the median ms of the GEMMs.
double openblas_ms(const Problem& p, int iters) {
#if defined(MOE_EP_HAVE_OPENBLAS)
  const int H = p.shape.H, I = p.shape.I, K = p.shape.K, E = p.shape.E;
  std::vector<std::vector<float>> xs(E);
  for (int r = 0; r < p.world_size; ++r)
    for (int t = 0; t < p.tokens(r); ++t)
      for (int k = 0; k < K; ++k) {
        const int e = p.ids[r][size_t(t) * K + k];
        if (e < 0) continue;
        for (int i = 0; i < H; ++i) xs[e].push_back(fmt::bf16_to_float(p.x[r][size_t(t) * H + i]));
      }
  std::vector<std::vector<float>> w13(E), w2(E);
  for (int e = 0; e < E; ++e) {
    if (xs[e].empty()) continue;
    w13[e].resize(size_t(2) * I * H);
    w2[e].resize(size_t(H) * I);
    dequantize_expert(p.pack, e, w13[e].data(), w2[e].data());
  }
  std::vector<double> times;
  std::vector<float> a, h, y;
  for (int it = 0; it < iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < E; ++e) {
      const int n = int(xs[e].size()) / H;
      if (!n) continue;
      a.resize(size_t(n) * 2 * I);
      h.resize(size_t(n) * I);
      y.resize(size_t(n) * H);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, 2 * I, H, 1.0f, xs[e].data(), H,
                  w13[e].data(), H, 0.0f, a.data(), 2 * I);
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < I; ++c)
          h[size_t(r) * I + c] =
              fmt::swiglu(a[size_t(r) * 2 * I + c], a[size_t(r) * 2 * I + I + c], -1);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, H, I, 1.0f, h.data(), I, w2[e].data(),
                  I, 0.0f, y.data(), H);
    }
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(times);
#else
  (void)p;
  (void)iters;
  return NAN;
#endif
}

}  // namespace

int cmd_bench(const BenchOptions& o) {
  const ModelShape* shape = &o.shape;
  const std::vector<Recipe>& recipes = o.recipes;
  const std::vector<int>& tokens = o.tokens;
  const std::string commit = shell_line("git rev-parse --short HEAD 2>/dev/null");
  const std::string device = "cpu: " + cpu_name() + " x" + std::to_string(omp_get_max_threads());
  std::ostringstream json;
  json << "[\n";
  bool first = true;
  std::printf("\n%-14s %-12s %6s %10s %10s %10s %9s %12s %9s\n", "shape", "recipe", "tokens",
              "median_ms", "min_ms", "max_ms", "GFLOP/s", "openblas_ms", "BLAS_GF/s");
  for (Recipe r : recipes) {
    // Weights are generated once per recipe; inputs per token count.
    Problem p = make_random_problem(*shape, r, o.ranks, std::vector<int>(o.ranks, tokens[0]),
                                    o.seed, o.routing, true);
    for (int T : tokens) {
      make_random_inputs(p, std::vector<int>(o.ranks, T), o.seed + T, o.routing);
      p.capacity = std::max(1, T);
      RunResult res = run_layers(p, Backend::kAuto, o.iters);
      const double blas =
          res.backend == Backend::kCPU ? openblas_ms(p, std::max(3, o.iters / 4)) : NAN;
      // Counted work: routed pairs and the bytes of every touched expert.
      size_t pairs = 0;
      std::vector<char> touched(shape->E, 0);
      for (int rk = 0; rk < p.world_size; ++rk)
        for (int32_t e : p.ids[rk])
          if (e >= 0) {
            ++pairs;
            touched[e] = 1;
          }
      const ExpertBytes eb = expert_bytes(p.config());
      const size_t per_expert = eb.w13 + eb.w2 + eb.w13_scale + eb.w2_scale;
      size_t weight_bytes = 0;
      for (char t : touched) weight_bytes += t ? per_expert : 0;
      const double flops = 6.0 * shape->H * shape->I * double(pairs);
      const double gflops = flops / (res.median_ms * 1e6);
      const double blas_gflops = flops / (blas * 1e6);
      std::printf("%-14s %-12s %6d %10.3f %10.3f %10.3f %9.1f %12.3f %9.1f\n", shape->name.c_str(),
                  recipe_name(r), T, res.median_ms, res.min_ms, res.max_ms, gflops, blas,
                  blas_gflops);
      std::fflush(stdout);
      char rec[2048];
      std::snprintf(
          rec, sizeof rec,
          "  {\"commit\": \"%s\", \"device\": \"%s\", \"backend\": \"%s\", \"ep\": %d, "
          "\"rank_count\": %d, \"shape\": \"%s\", \"H\": %d, \"I\": %d, \"E\": %d, \"K\": %d, "
          "\"recipe\": \"%s\", \"tokens_per_rank\": %d, \"routing\": \"%s\", "
          "\"median_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, "
          "\"weight_bytes_read\": %zu, \"hbm_fraction\": null, \"tflops\": %.6f, "
          "\"mma_fraction\": null, \"dispatch_bytes\": 0, \"nvlink_GBps\": null, "
          "\"gflops\": %.3f, \"openblas_sgemm_median_us\": %.3f, \"openblas_gflops\": %.3f, "
          "\"config\": {\"threads\": %d, \"iters\": %d}}",
          commit.c_str(), device.c_str(), backend_name(res.backend), o.ranks, o.ranks,
          shape->name.c_str(), shape->H, shape->I, shape->E, shape->K, recipe_name(r), T,
          o.routing.c_str(), res.median_ms * 1e3, res.min_ms * 1e3, res.max_ms * 1e3, weight_bytes,
          flops / (res.median_ms * 1e9), gflops, blas * 1e3, blas_gflops, omp_get_max_threads(),
          o.iters);
      json << (first ? "" : ",\n") << rec;
      first = false;
    }
  }
  json << "\n]\n";
  if (!o.json.empty()) {
    const std::string text = json.str();
    std::ofstream f(o.json, std::ios::trunc);
    if (!f)
      throw Error(
          ErrorCode::kInvalidArgument,
          "--json " + o.json + ": cannot open the file for writing (" + std::strerror(errno) + ")");
    f << text;
    f.close();
    if (!f) throw Error(ErrorCode::kBackend, "--json " + o.json + ": writing failed (disk full?)");
    std::printf("\nwrote %s: %zu records, %zu bytes\n", o.json.c_str(),
                size_t(recipes.size() * tokens.size()), text.size());
  }
  return 0;
}

}  // namespace moe_ep::cli
