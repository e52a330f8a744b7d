#include "problem.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <numeric>
#include <random>
#include <thread>

#include "device_io.h"
#include "moe_ep/formats.h"
#include "moe_ep/status.h"

namespace moe_ep::cli {

const std::vector<ModelShape>& model_shapes() {
  static const std::vector<ModelShape> shapes = {
      {"tiny", 512, 256, 16, 4},  // the default: runs in seconds on 2 cores
      {"qwen3-30b-a3b", 2048, 768, 128, 8},
      {"dsv3", 7168, 2048, 256, 8},
      {"gpt-oss-120b", 2880, 2880, 128, 4},
      {"mixtral-8x7b", 4096, 14336, 8, 2},
  };
  return shapes;
}

std::optional<ModelShape> find_shape(const std::string& name) {
  for (auto& s : model_shapes())
    if (s.name == name) return s;
  return std::nullopt;
}

LayerConfig Problem::config() const {
  LayerConfig c;
  c.fleet.num_experts = shape.E;
  c.fleet.hidden_size = shape.H;
  c.fleet.max_tokens_per_rank = capacity;
  c.recipe.recipe = recipe;
  c.recipe.intermediate_size = shape.I;
  c.recipe.top_k = shape.K;
  c.recipe.swiglu_limit = swiglu_limit;
  c.recipe.apply_topk_in_fc1 = apply_topk_in_fc1;
  return c;
}

namespace {

void progress(bool verbose, const char* fmt_str, const std::string& a) {
  if (verbose) {
    std::fprintf(stderr, fmt_str, a.c_str());
    std::fflush(stderr);
  }
}

}  // namespace

void make_random_inputs(Problem& p, const std::vector<int>& tokens, uint64_t seed,
                        const std::string& routing) {
  const int H = p.shape.H, K = p.shape.K, E = p.shape.E;
  if (routing != "uniform" && routing != "zipf")
    throw Error(ErrorCode::kInvalidArgument,
                "routing '" + routing + "' is not one of: uniform, zipf");
  if (K > E)
    throw Error(ErrorCode::kInvalidArgument,
                "top_k " + std::to_string(K) + " > experts " + std::to_string(E));
  std::vector<double> zipf(E);
  for (int e = 0; e < E; ++e) zipf[e] = 1.0 / std::pow(double(e + 1), 1.1);
  p.x.assign(p.world_size, {});
  p.ids.assign(p.world_size, {});
  p.topk_w.assign(p.world_size, {});
  for (int r = 0; r < p.world_size; ++r) {
    std::mt19937_64 rng(seed * 7919 + r);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int T = tokens[r];
    p.x[r].resize(size_t(T) * H);
    for (auto& v : p.x[r]) v = fmt::float_to_bf16(nd(rng));
    p.ids[r].resize(size_t(T) * K);
    p.topk_w[r].resize(size_t(T) * K);
    std::vector<int> perm(E);
    std::discrete_distribution<int> zd(zipf.begin(), zipf.end());
    for (int t = 0; t < T; ++t) {
      if (routing == "uniform") {
        std::iota(perm.begin(), perm.end(), 0);
        for (int k = 0; k < K; ++k) {
          std::uniform_int_distribution<int> ud(k, E - 1);
          std::swap(perm[k], perm[ud(rng)]);
          p.ids[r][size_t(t) * K + k] = perm[k];
        }
      } else {
        for (int k = 0; k < K; ++k) {
          int e;
          bool dup;
          do {
            e = zd(rng);
            dup = false;
            for (int j = 0; j < k; ++j) dup = dup || p.ids[r][size_t(t) * K + j] == e;
          } while (dup);
          p.ids[r][size_t(t) * K + k] = e;
        }
      }
      // Softmax-like positive weights that sum to 1.
      float sum = 0;
      for (int k = 0; k < K; ++k) sum += p.topk_w[r][size_t(t) * K + k] = 0.2f + std::abs(nd(rng));
      for (int k = 0; k < K; ++k) p.topk_w[r][size_t(t) * K + k] /= sum;
    }
  }
}

Problem make_random_problem(const ModelShape& shape, Recipe recipe, int world_size,
                            const std::vector<int>& tokens, uint64_t seed,
                            const std::string& routing, bool verbose) {
  Problem p;
  p.shape = shape;
  p.recipe = recipe;
  p.world_size = world_size;
  p.capacity = std::max(1, *std::max_element(tokens.begin(), tokens.end()));
  const size_t H = shape.H, I = shape.I, E = shape.E;
  progress(verbose, "[moe-ep] generating %s master weights... ", shape.name);
  const auto t0 = std::chrono::steady_clock::now();
  p.w13.resize(E * 2 * I * H);
  p.w2.resize(E * H * I);
  // Each expert from its own stream (parallel, reproducible).
#pragma omp parallel for schedule(dynamic)
  for (int e = 0; e < int(E); ++e) {
    std::mt19937_64 rng(seed * 1000003 + e);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const float s1 = 1.0f / std::sqrt(float(H)), s2 = 1.0f / std::sqrt(float(I));
    for (size_t i = 0; i < 2 * I * H; ++i) p.w13[e * 2 * I * H + i] = nd(rng) * s1;
    for (size_t i = 0; i < H * I; ++i) p.w2[e * H * I + i] = nd(rng) * s2;
  }
  progress(verbose, "packing (%s)... ", recipe_name(recipe));
  // h = silu(g) * u is O(0.1) here; a norm constant lifts its block scales out of E4M3's
  // subnormal range (as a calibrated checkpoint's would).
  std::vector<float> fc1_nc(E, 16.0f);
  p.pack = pack_expert_weights(recipe, p.w13.data(), p.w2.data(), int(E), int(H), int(I), 1.0f,
                               fc1_nc.data());
  if (verbose)
    std::fprintf(stderr, "done (%.1f s)\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  make_random_inputs(p, tokens, seed, routing);
  return p;
}

std::vector<double> dense_reference(const Problem& p, int rank) {
  const int H = p.shape.H, I = p.shape.I, K = p.shape.K, T = p.tokens(rank);
  if (p.w13.empty())
    throw Error(ErrorCode::kInvalidArgument,
                "dense_reference needs fp32 master weights (not available for loaded packs)");
  std::vector<double> out(size_t(T) * H, 0.0);
  const float limit = p.swiglu_limit ? *p.swiglu_limit : -1.0f;
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < T; ++t) {
    std::vector<double> x(H), h(I);
    for (int i = 0; i < H; ++i) x[i] = fmt::bf16_to_float(p.x[rank][size_t(t) * H + i]);
    for (int k = 0; k < K; ++k) {
      const int e = p.ids[rank][size_t(t) * K + k];
      if (e < 0) continue;
      const float* w13 = p.w13.data() + size_t(e) * 2 * I * H;
      const float* w2 = p.w2.data() + size_t(e) * H * I;
      for (int j = 0; j < I; ++j) {
        double g = 0, u = 0;
        for (int i = 0; i < H; ++i) {
          g += double(w13[size_t(j) * H + i]) * x[i];
          u += double(w13[size_t(I + j) * H + i]) * x[i];
        }
        if (limit >= 0) {
          g = std::min(g, double(limit));
          u = std::clamp(u, -double(limit), double(limit));
        }
        h[j] = u * g / (1.0 + std::exp(-g));
      }
      const double c = p.topk_w[rank][size_t(t) * K + k];
      for (int i = 0; i < H; ++i) {
        double y = 0;
        for (int j = 0; j < I; ++j) y += double(w2[size_t(i) * I + j]) * h[j];
        out[size_t(t) * H + i] += c * y;
      }
    }
  }
  return out;
}

RunResult run_layers(const Problem& p, Backend backend, int iterations) {
  const int W = p.world_size;
  const int El = p.shape.E / W;
  auto fleet = make_cpu_fleet(W);
  RunResult res;
  res.out.resize(W);
  std::vector<std::vector<double>> times(W);
  std::vector<std::exception_ptr> errors(W);
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) {
    threads.emplace_back([&, r] {
      try {
        Bootstrap b;
        b.world_size = W;
        b.rank = r;
        b.backend = backend;
        b.cpu_fleet = fleet;
        b.device = r;
        MegaLayer layer(b, p.config(), p.pack.view(r * El, El), p.pack.epilogue_view(r * El, El));
        if (r == 0) {
          res.backend = layer.backend();
          res.workspace_bytes = layer.workspace_bytes(layer.default_workspace());
        }
        layer.warmup();
        const int T = p.tokens(r), H = p.shape.H, K = p.shape.K;
        const bool gpu = layer.backend() == Backend::kCUDA;
        const Device dev = gpu ? Device{DeviceKind::kCUDA, r} : Device{};
        res.out[r].assign(size_t(T) * H, 0x7fc0);  // poisoned: every element must be written
        std::shared_ptr<void> dx, dids, dw, dout;
        void* px = const_cast<uint16_t*>(p.x[r].data());
        void* pids = const_cast<int32_t*>(p.ids[r].data());
        void* pw = const_cast<float*>(p.topk_w[r].data());
        void* pout = res.out[r].data();
        if (gpu) {
          dx = to_device(px, p.x[r].size() * 2, r);
          dids = to_device(pids, p.ids[r].size() * 4, r);
          dw = to_device(pw, p.topk_w[r].size() * 4, r);
          dout = to_device(pout, res.out[r].size() * 2, r);
          px = dx.get(), pids = dids.get(), pw = dw.get(), pout = dout.get();
        }
        ForwardInputs in;
        in.hidden_states = TensorView::contiguous(px, DType::kBF16, {T, H}, dev);
        in.topk_ids = TensorView::contiguous(pids, DType::kI32, {T, K}, dev);
        in.topk_weights = TensorView::contiguous(pw, DType::kF32, {T, K}, dev);
        TensorView out = TensorView::contiguous(pout, DType::kBF16, {T, H}, dev);
        for (int it = 0; it < std::max(1, iterations); ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          layer.forward(in, out);
          if (gpu) device_sync();
          times[r].push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        if (gpu) to_host(res.out[r].data(), pout, res.out[r].size() * 2);
        layer.destroy();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<double> slowest(times[0].size(), 0.0);
  for (int r = 0; r < W; ++r)
    for (size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], times[r][i]);
  std::vector<double> sorted = slowest;
  std::sort(sorted.begin(), sorted.end());
  res.median_ms = sorted[sorted.size() / 2];
  res.min_ms = sorted.front();
  res.max_ms = sorted.back();
  return res;
}

double rel_l2(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = fmt::bf16_to_float(a[i]), y = fmt::bf16_to_float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double rel_l2(const std::vector<uint16_t>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = fmt::bf16_to_float(a[i]);
    num += (x - ref[i]) * (x - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool has_nan(const std::vector<uint16_t>& a) {
  for (uint16_t v : a)
    if ((v & 0x7fff) > 0x7f80) return true;
  return false;
}

}  // namespace moe_ep::cli
