#include "problem.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <numeric>
#include <random>
#include <thread>

#include "device_io.h"
#include "memory_budget.h"
#if defined(MOE_EP_HAVE_CUDA)
#include "layer/diagnostics.h"
#endif
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
  c.recipe.swiglu_alpha = swiglu_alpha;
  c.recipe.swiglu_beta = swiglu_beta;
  c.recipe.input_norm_const = input_norm_const;
  c.recipe.has_expert_bias = !fc1_bias.empty() || !fc2_bias.empty();
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
  if (p.world_size < 1 || int(tokens.size()) != p.world_size)
    throw Error(ErrorCode::kInvalidArgument,
                "make_random_inputs: " + std::to_string(tokens.size()) +
                    " token counts for W = " + std::to_string(p.world_size) + " ranks");
  for (int t : tokens)
    if (t < 0)
      throw Error(ErrorCode::kInvalidArgument,
                  "make_random_inputs: token count " + std::to_string(t) + " is negative");
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
  if (world_size < 1 || int(tokens.size()) != world_size)
    throw Error(ErrorCode::kInvalidArgument,
                "make_random_problem: " + std::to_string(tokens.size()) +
                    " token counts for W = " + std::to_string(world_size) + " ranks");
  if (shape.E < 1 || shape.H < 1 || shape.I < 1 || shape.K < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "make_random_problem: shape " + shape.name + " has a dimension < 1");
  Problem p;
  p.shape = shape;
  p.recipe = recipe;
  p.world_size = world_size;
  p.capacity = std::max(1, *std::max_element(tokens.begin(), tokens.end()));
  const size_t H = shape.H, I = shape.I, E = shape.E;
  progress(verbose, "[moe-ep] generating %s master weights... ", shape.name);
  memory_stage("generating the fp32 master weights of shape " + shape.name + " (" +
               std::to_string(E) + " experts x 3 x " + std::to_string(I) + " x " +
               std::to_string(H) + " x 4 bytes = " + gigabytes(E * 3 * I * H * 4) + ")");
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
  memory_stage(std::string("packing the weights of shape ") + shape.name + " for recipe " +
               recipe_name(recipe));
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
  if (p.w13.empty())
    throw Error(ErrorCode::kInvalidArgument,
                "dense_reference needs fp32 master weights (not available for loaded packs)");
  DenseLayer l;
  l.H = p.shape.H, l.I = p.shape.I, l.K = p.shape.K;
  l.w13 = p.w13.data();
  l.w2 = p.w2.data();
  l.fc1_bias = p.fc1_bias.empty() ? nullptr : p.fc1_bias.data();
  l.fc2_bias = p.fc2_bias.empty() ? nullptr : p.fc2_bias.data();
  l.swiglu_limit = p.swiglu_limit;
  l.swiglu_alpha = p.swiglu_alpha;
  l.swiglu_beta = p.swiglu_beta;
  return dense_reference(l, p.x[rank], p.ids[rank], p.topk_w[rank]);
}

std::vector<double> dense_reference(const DenseLayer& l, const std::vector<uint16_t>& xs,
                                    const std::vector<int32_t>& ids,
                                    const std::vector<float>& topk_w) {
  const int H = l.H, I = l.I, K = l.K, T = int(ids.size()) / K;
  std::vector<double> out(size_t(T) * H, 0.0);
  const float limit = l.swiglu_limit ? *l.swiglu_limit : -1.0f;
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < T; ++t) {
    std::vector<double> x(H), h(I);
    for (int i = 0; i < H; ++i) x[i] = fmt::bf16_to_float(xs[size_t(t) * H + i]);
    for (int k = 0; k < K; ++k) {
      const int e = ids[size_t(t) * K + k];
      if (e < 0) continue;
      const float* w13 = l.w13 + size_t(e) * 2 * I * H;
      const float* w2 = l.w2 + size_t(e) * H * I;
      const float* b13 = l.fc1_bias ? l.fc1_bias + size_t(e) * 2 * I : nullptr;
      const float* b2 = l.fc2_bias ? l.fc2_bias + size_t(e) * H : nullptr;
      for (int j = 0; j < I; ++j) {
        double g = 0, u = 0;
        for (int i = 0; i < H; ++i) {
          g += double(w13[size_t(j) * H + i]) * x[i];
          u += double(w13[size_t(I + j) * H + i]) * x[i];
        }
        if (b13) g += b13[j], u += b13[I + j];
        if (limit >= 0) {
          g = std::min(g, double(limit));
          u = std::clamp(u, -double(limit), double(limit));
        }
        h[j] = (u + l.swiglu_beta) * g / (1.0 + std::exp(-double(l.swiglu_alpha) * g));
      }
      const double c = topk_w[size_t(t) * K + k];
      for (int i = 0; i < H; ++i) {
        double y = b2 ? double(b2[i]) : 0.0;
        for (int j = 0; j < I; ++j) y += double(w2[size_t(i) * I + j]) * h[j];
        out[size_t(t) * H + i] += c * y;
      }
    }
  }
  return out;
}

namespace {

bool g_gpu_processes = false;

// One rank's layer: build, warm up, run `iterations` forwards (timed, host to device sync),
// copy the output to `out` (poisoned first: every element must be written).
void run_rank(const Problem& p, Backend backend, int iterations, int r, const Bootstrap& base,
              std::vector<uint16_t>& out, std::vector<double>& times, RunResult* info) {
  const int W = p.world_size, El = p.shape.E / W;
  Bootstrap b = base;
  b.world_size = W;
  b.rank = r;
  b.backend = backend;
  b.device = r;
  EpilogueVectors ep = p.pack.epilogue_view(r * El, El);
  const int64_t bias13 = 2 * int64_t(p.shape.I), bias2 = p.shape.H;
  if (!p.fc1_bias.empty())
    ep.fc1_bias = TensorView::contiguous(const_cast<float*>(p.fc1_bias.data()) + r * El * bias13,
                                         DType::kF32, {El, bias13});
  if (!p.fc2_bias.empty())
    ep.fc2_bias = TensorView::contiguous(const_cast<float*>(p.fc2_bias.data()) + r * El * bias2,
                                         DType::kF32, {El, bias2});
  MegaLayer layer(b, p.config(), p.pack.view(r * El, El), ep);
  if (info) {
    info->backend = layer.backend();
    info->workspace_bytes = layer.workspace_bytes(layer.default_workspace());
  }
  layer.warmup();
  const int T = p.tokens(r), H = p.shape.H, K = p.shape.K;
  const bool gpu = layer.backend() == Backend::kCUDA;
  const Device dev = gpu ? Device{DeviceKind::kCUDA, r} : Device{};
  out.assign(size_t(T) * H, 0x7fc0);
  std::shared_ptr<void> dx, dids, dw, dout;
  void* px = const_cast<uint16_t*>(p.x[r].data());
  void* pids = const_cast<int32_t*>(p.ids[r].data());
  void* pw = const_cast<float*>(p.topk_w[r].data());
  void* pout = out.data();
  if (gpu) {
    dx = to_device(px, p.x[r].size() * 2, r);
    dids = to_device(pids, p.ids[r].size() * 4, r);
    dw = to_device(pw, p.topk_w[r].size() * 4, r);
    dout = to_device(pout, out.size() * 2, r);
    px = dx.get(), pids = dids.get(), pw = dw.get(), pout = dout.get();
  }
  ForwardInputs in;
  in.hidden_states = TensorView::contiguous(px, DType::kBF16, {T, H}, dev);
  in.topk_ids = TensorView::contiguous(pids, DType::kI32, {T, K}, dev);
  in.topk_weights = TensorView::contiguous(pw, DType::kF32, {T, K}, dev);
  TensorView ov = TensorView::contiguous(pout, DType::kBF16, {T, H}, dev);
  for (int it = 0; it < std::max(1, iterations); ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    layer.forward(in, ov);
    if (gpu) device_sync();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (gpu) to_host(out.data(), pout, out.size() * 2);
  if (info) info->plan = layer.last_plan().to_string();
  layer.destroy();
}

void summarize(RunResult& res, const std::vector<std::vector<double>>& times) {
  std::vector<double> slowest(times[0].size(), 0.0);
  for (size_t r = 0; r < times.size(); ++r)
    for (size_t i = 0; i < slowest.size() && i < times[r].size(); ++i)
      slowest[i] = std::max(slowest[i], times[r][i]);
  std::vector<double> sorted = slowest;
  std::sort(sorted.begin(), sorted.end());
  res.median_ms = sorted[sorted.size() / 2];
  res.min_ms = sorted.front();
  res.max_ms = sorted.back();
}

#if defined(MOE_EP_HAVE_CUDA)
constexpr int kMaxProcIters = 4096;
struct ProcShared {
  SharedUniqueId uid;
  struct Rank {
    int done, failed, backend, niters;
    size_t workspace_bytes;
    char msg[2048];
    char plan[2048];
    double times[kMaxProcIters];
  } rank[64];
};

// One process per GPU; outputs come back through the shared mapping after the header.
RunResult run_layers_processes(const Problem& p, Backend backend, int iterations) {
  const int W = p.world_size;
  if (W > 64) throw Error(ErrorCode::kInvalidArgument, "--gpus " + std::to_string(W) + " > 64");
  if (iterations > kMaxProcIters)
    throw Error(ErrorCode::kInvalidArgument, "--iters " + std::to_string(iterations) + " > " +
                                                 std::to_string(kMaxProcIters) + " with --gpus");
  std::vector<size_t> out_off(W + 1, 0);
  out_off[0] = (sizeof(ProcShared) + 255) / 256 * 256;
  for (int r = 0; r < W; ++r) out_off[r + 1] = out_off[r] + p.x[r].size() * 2;
  const size_t bytes = out_off[W];
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw Error(ErrorCode::kBackend, "mmap of the shared results failed");
  auto* sh = new (mem) ProcShared();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  // NVLink multicast (NVLS) off unless the user chose: the ranks inherit it.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  for (int r = 0; r < W; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw Error(ErrorCode::kBackend, "fork failed");
    if (pid == 0) {
      auto& me = sh->rank[r];
      int rc = 0;
      try {
        Bootstrap b;
        b.nccl_unique_id = sh->uid.exchange(r);
        std::vector<uint16_t> out;
        std::vector<double> times;
        RunResult info;
        run_rank(p, backend, iterations, r, b, out, times, &info);
        std::memcpy(static_cast<char*>(mem) + out_off[r], out.data(), out.size() * 2);
        me.niters = int(times.size());
        for (size_t i = 0; i < times.size(); ++i) me.times[i] = times[i];
        me.backend = int(info.backend);
        me.workspace_bytes = info.workspace_bytes;
        std::snprintf(me.plan, sizeof me.plan, "%s", info.plan.c_str());
      } catch (const std::exception& e) {
        std::snprintf(me.msg, sizeof me.msg, "rank %d: %s", r, e.what());
        me.failed = 1;
        rc = 1;
      }
      me.done = 1;
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  // Each rank bounds its own waits (the layer's timeouts); this bound only catches a hang.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(30);
  size_t left = pids.size();
  bool hung = false;
  while (left > 0) {
    int st = 0;
    const pid_t q = waitpid(-1, &st, WNOHANG);
    if (q > 0) {
      --left;
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      hung = true;
      for (pid_t k : pids) kill(k, SIGKILL);
      while (waitpid(-1, &st, 0) > 0) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string errors;
  for (int r = 0; r < W; ++r) {
    const auto& me = sh->rank[r];
    if (me.failed)
      errors += std::string("\n  ") + me.msg;
    else if (!me.done)
      errors += "\n  rank " + std::to_string(r) + " exited without a result" +
                (hung ? " (killed after 30 minutes)" : "");
  }
  RunResult res;
  if (errors.empty()) {
    res.out.resize(W);
    std::vector<std::vector<double>> times(W);
    for (int r = 0; r < W; ++r) {
      const uint16_t* o = reinterpret_cast<const uint16_t*>(static_cast<char*>(mem) + out_off[r]);
      res.out[r].assign(o, o + p.x[r].size());
      times[r].assign(sh->rank[r].times, sh->rank[r].times + sh->rank[r].niters);
    }
    res.backend = Backend(sh->rank[0].backend);
    res.workspace_bytes = sh->rank[0].workspace_bytes;
    res.plan = sh->rank[0].plan;
    summarize(res, times);
  }
  sh->~ProcShared();
  munmap(mem, bytes);
  if (!errors.empty()) throw Error(ErrorCode::kPeer, "the per-GPU processes failed:" + errors);
  return res;
}
#endif

}  // namespace

void set_gpu_processes(bool on) { g_gpu_processes = on; }
bool gpu_processes() { return g_gpu_processes; }

RunResult run_layers(const Problem& p, Backend backend, int iterations) {
  const int W = p.world_size;
#if defined(MOE_EP_HAVE_CUDA)
  if (g_gpu_processes && backend != Backend::kCPU)
    return run_layers_processes(p, Backend::kCUDA, iterations);
#else
  if (g_gpu_processes)
    throw Error(ErrorCode::kUnsupported, "--gpus needs a build with the CUDA backend");
#endif
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
        b.cpu_fleet = fleet;
        run_rank(p, backend, iterations, r, b, res.out[r], times[r], r == 0 ? &res : nullptr);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  summarize(res, times);
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

bool has_nonfinite(const std::vector<uint16_t>& a) {
  for (uint16_t v : a)
    if ((v & 0x7fff) >= 0x7f80) return true;
  return false;
}

}  // namespace moe_ep::cli
