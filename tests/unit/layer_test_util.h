// Shared helpers of the layer tests (tests/unit/test_layer_*.cpp): a fleet of rank threads,
// weight packs and inputs made here (independent of weight_prep), a runner for call sequences,
// and an independent float64 computation of docs/contract.md §3.1 that is the oracle of the recipe
// tests.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "moe_ep/config.h"
#include "moe_ep/formats.h"
#include "moe_ep/layer.h"
#include "moe_ep/status.h"
#include "moe_ep/tensor.h"

namespace moe_ep {
// GoogleTest prints parameters through PrintTo found by argument-dependent lookup.
inline void PrintTo(Recipe r, std::ostream* os) { *os << recipe_name(r); }
}  // namespace moe_ep

namespace moe_ep::test {

using Bits = std::vector<uint16_t>;  // bf16 values as raw bits

constexpr uint16_t kPoison = 0x7FC0;  // a bf16 NaN; written into outputs before a call

// ---------------------------------------------------------------------------------------------
// Rank threads

// Runs fn(rank) on `world` threads; returns each rank's exception (null where none).
inline std::vector<std::exception_ptr> run_fleet_collect(int world,
                                                         const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errs(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errs[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errs;
}

// The bootstrap of CPU rank r of W sharing `fleet` (none for W = 1), with the given timeouts.
inline Bootstrap cpu_boot(int W, int r, std::shared_ptr<CpuFleet> fleet,
                          int64_t timeout_ms = 30000) {
  Bootstrap b;
  b.world_size = W;
  b.rank = r;
  b.backend = Backend::kCPU;
  b.cpu_fleet = std::move(fleet);
  b.timeout_ms = timeout_ms;
  b.warmup_timeout_ms = std::max<int64_t>(timeout_ms, 2000);
  return b;
}

// Runs fn(rank) on `world` threads and rethrows the first (lowest rank) exception.
inline void run_fleet(int world, const std::function<void(int)>& fn) {
  for (auto& e : run_fleet_collect(world, fn))
    if (e) std::rethrow_exception(e);
}

struct Caught {
  bool thrown = false;
  bool is_moe_error = false;
  ErrorCode code = ErrorCode::kBackend;
  std::string what;
};

inline Caught inspect(const std::exception_ptr& e) {
  Caught c;
  if (!e) return c;
  c.thrown = true;
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    c.is_moe_error = true;
    c.code = err.code();
    c.what = err.what();
  } catch (const std::exception& err) {
    c.what = err.what();
  } catch (...) {
    c.what = "(not a std::exception)";
  }
  return c;
}

template <class F>
Caught catch_error(F&& f) {
  try {
    f();
  } catch (...) {
    return inspect(std::current_exception());
  }
  return {};
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline std::string lower(std::string s) {
  for (auto& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// ---------------------------------------------------------------------------------------------
// Random numbers: splitmix64, fast enough for hundreds of millions of weight bytes.

struct Rng {
  uint64_t s;
  // The seed is mixed first: nearby seeds must not give the same stream shifted by a step.
  explicit Rng(uint64_t seed) : s(mix(seed ^ 0x5DEECE66Dull) ^ mix(seed + 0x1234567ull)) {}
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t next() { return mix(s += 0x9E3779B97F4A7C15ull); }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  int below(int n) { return int(next() % uint64_t(n)); }
  // Approximately normal (sum of four uniforms), std 1.
  double normal() {
    double a = uniform() + uniform() + uniform() + uniform() - 2.0;
    return a * std::sqrt(3.0);
  }
};

// ---------------------------------------------------------------------------------------------
// Weight packs in the checkpoint layout of docs/contract.md §3.1, all E experts of the layer.

struct HostPack {
  Recipe recipe = Recipe::kBf16;
  int E = 0, H = 0, I = 0;
  std::vector<uint8_t> w13, w2, w13_scale, w2_scale;  // bf16: w13/w2 hold bf16 bits
  std::vector<float> fc1_alpha, fc2_alpha, fc1_norm_const;
  std::vector<float> fc1_bias, fc2_bias;  // [E][2I], [E][H]; empty: no expert bias

  RecipeTraits traits() const { return recipe_traits(recipe); }
  bool four_bit() const { return traits().weights_4bit; }
  int block() const { return traits().weight_block; }
  size_t w13_bytes() const { return four_bit() ? size_t(2) * I * H / 2 : size_t(2) * I * H * 2; }
  size_t w2_bytes() const { return four_bit() ? size_t(H) * I / 2 : size_t(H) * I * 2; }
  size_t w13_scale_bytes() const { return four_bit() ? size_t(2) * I * H / block() : 0; }
  size_t w2_scale_bytes() const { return four_bit() ? size_t(H) * I / block() : 0; }

  void allocate(Recipe r, int e, int h, int i) {
    recipe = r;
    E = e;
    H = h;
    I = i;
    w13.assign(w13_bytes() * E, 0);
    w2.assign(w2_bytes() * E, 0);
    w13_scale.assign(w13_scale_bytes() * E, 0);
    w2_scale.assign(w2_scale_bytes() * E, 0);
    fc1_alpha.assign(E, 1.0f);
    fc2_alpha.assign(E, 1.0f);
    fc1_norm_const.assign(E, 1.0f);
  }

  // Views of experts [first, first + count): one rank's share.
  WeightPack view(int first, int count, DType scale_dtype = DType::kU8) const {
    WeightPack p;
    auto ptr = [](const std::vector<uint8_t>& v, size_t off) {
      return const_cast<uint8_t*>(v.data()) + off;
    };
    if (four_bit()) {
      const int g = block();
      p.w13 =
          TensorView::contiguous(ptr(w13, first * w13_bytes()), DType::kU8, {count, 2 * I, H / 2});
      p.w2 = TensorView::contiguous(ptr(w2, first * w2_bytes()), DType::kU8, {count, H, I / 2});
      p.w13_scale = TensorView::contiguous(ptr(w13_scale, first * w13_scale_bytes()), scale_dtype,
                                           {count, 2 * I, H / g});
      p.w2_scale = TensorView::contiguous(ptr(w2_scale, first * w2_scale_bytes()), scale_dtype,
                                          {count, H, I / g});
    } else {
      p.w13 =
          TensorView::contiguous(ptr(w13, first * w13_bytes()), DType::kBF16, {count, 2 * I, H});
      p.w2 = TensorView::contiguous(ptr(w2, first * w2_bytes()), DType::kBF16, {count, H, I});
    }
    return p;
  }

  EpilogueVectors epilogue_view(int first, int count) const {
    auto v = [&](const std::vector<float>& a) {
      return TensorView::contiguous(const_cast<float*>(a.data()) + first, DType::kF32, {count});
    };
    EpilogueVectors ev{v(fc1_alpha), v(fc2_alpha), v(fc1_norm_const), {}, {}};
    auto b = [&](const std::vector<float>& a, int n) {
      return a.empty() ? TensorView{}
                       : TensorView::contiguous(const_cast<float*>(a.data()) + size_t(first) * n,
                                                DType::kF32, {count, n});
    };
    ev.fc1_bias = b(fc1_bias, 2 * I);
    ev.fc2_bias = b(fc2_bias, H);
    return ev;
  }

  // One weight row as the GEMM sees it (q * s; the nvfp4 alphas stay out).
  void row(bool fc1, int e, int r, float* out) const {
    const int n = fc1 ? H : I;
    const size_t rows = fc1 ? size_t(2) * I : size_t(H);
    const size_t idx = size_t(e) * rows + r;
    if (!four_bit()) {
      const auto* b = reinterpret_cast<const uint16_t*>((fc1 ? w13 : w2).data()) + idx * n;
      for (int i = 0; i < n; ++i) out[i] = fmt::bf16_to_float(b[i]);
      return;
    }
    static const float* lut = [] {
      static float t[16];
      for (int c = 0; c < 16; ++c) t[c] = fmt::e2m1_to_float(uint8_t(c));
      return t;
    }();
    const uint8_t* q = (fc1 ? w13 : w2).data() + idx * (n / 2);
    const uint8_t* s = (fc1 ? w13_scale : w2_scale).data() + idx * (n / block());
    const bool e4m3 = traits().e4m3_scales;
    const int g = block();
    for (int b = 0; b < n / g; ++b) {
      const float sc = e4m3 ? fmt::e4m3_to_float(s[b]) : fmt::ue8m0_to_float(s[b]);
      for (int i = 0; i < g; i += 2) {
        const uint8_t byte = q[(b * g + i) / 2];
        out[b * g + i] = lut[byte & 15] * sc;
        out[b * g + i + 1] = lut[byte >> 4] * sc;
      }
    }
  }
};

// A pack of random quantized weights (random E2M1 nibbles, scales in a band chosen so that g and
// u come out with a standard deviation of about 3 and y of about 1 for unit-variance inputs).
// Built directly in the checkpoint layout, so the reference depends on no packing code.
inline HostPack random_pack(Recipe recipe, int E, int H, int I, uint64_t seed,
                            float input_norm_const = 1.0f) {
  HostPack p;
  p.allocate(recipe, E, H, I);
  Rng rng(seed);
  const double g_std = 3.0, h_std = 6.0, y_std = 1.0;
  if (!p.four_bit()) {
    auto fill = [&](std::vector<uint8_t>& bytes, double stddev) {
      auto* b = reinterpret_cast<uint16_t*>(bytes.data());
      const size_t n = bytes.size() / 2;
      const double a = stddev * std::sqrt(3.0);  // uniform in [-a, a], four per draw
      const float step = float(2.0 * a / 65536.0), lo = float(-a);
      for (size_t i = 0; i < n; i += 4) {
        const uint64_t bits = rng.next();
        for (size_t j = 0; j < 4 && i + j < n; ++j)
          b[i + j] = fmt::float_to_bf16(lo + step * float((bits >> (16 * j)) & 0xffff));
      }
    };
    fill(p.w13, g_std / std::sqrt(double(H)));
    fill(p.w2, y_std / (h_std * std::sqrt(double(I))));
    return p;
  }
  auto fill_bytes = [&](std::vector<uint8_t>& v) {
    size_t i = 0;
    for (; i + 8 <= v.size(); i += 8) {
      const uint64_t r = rng.next();
      std::memcpy(v.data() + i, &r, 8);
    }
    for (; i < v.size(); ++i) v[i] = uint8_t(rng.next());
  };
  fill_bytes(p.w13);
  fill_bytes(p.w2);
  const double q_rms = 2.93;  // rms of a uniformly random E2M1 code
  if (p.traits().e4m3_scales) {
    // NVFP4 weights (nvfp4, nvfp4_bf16). E4M3 scale codes 0x30..0x48 (0.5 .. 4.0); rms about 2.
    // The norm constants are nvfp4's only (nvfp4_bf16 quantizes neither x nor h).
    const bool nvfp4 = recipe == Recipe::kNvfp4;
    for (auto& b : p.w13_scale) b = uint8_t(0x30 + rng.below(0x19));
    for (auto& b : p.w2_scale) b = uint8_t(0x30 + rng.below(0x19));
    for (int e = 0; e < E; ++e) {
      const double spread = std::exp2(rng.uniform() * 2.0 - 1.0);
      const float nc = float(std::exp2(double(rng.below(3) - 1)));  // 0.5, 1, 2
      p.fc1_norm_const[e] = nvfp4 ? nc : 1.0f;
      p.fc1_alpha[e] = float(spread * g_std / (std::sqrt(double(H)) * 2.0 * q_rms) /
                             (nvfp4 ? input_norm_const : 1.0f));
      p.fc2_alpha[e] = float(spread * y_std / (std::sqrt(double(I)) * 2.0 * q_rms * h_std) /
                             p.fc1_norm_const[e]);
    }
  } else {
    auto ue8m0_band = [&](std::vector<uint8_t>& v, double target) {
      const int e0 = int(std::lround(std::log2(target)));
      for (auto& b : v) b = uint8_t(127 + e0 + rng.below(3) - 1);
    };
    ue8m0_band(p.w13_scale, g_std / (std::sqrt(double(H)) * q_rms));
    ue8m0_band(p.w2_scale, y_std / (std::sqrt(double(I)) * q_rms * h_std));
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Inputs of one rank for one call.

struct RankInputs {
  int T = 0, H = 0, K = 0;
  Bits x;                    // bf16 [T, H]
  std::vector<int32_t> ids;  // [T, K]
  std::vector<float> w;      // [T, K]

  ForwardInputs forward_inputs() const {
    ForwardInputs in;
    in.hidden_states =
        TensorView::contiguous(const_cast<uint16_t*>(x.data()), DType::kBF16, {T, H});
    in.topk_ids = TensorView::contiguous(const_cast<int32_t*>(ids.data()), DType::kI32, {T, K});
    in.topk_weights = TensorView::contiguous(const_cast<float*>(w.data()), DType::kF32, {T, K});
    return in;
  }
};

enum class Routing { kUniform, kZipf, kOneExpert, kAllEmpty };

// Random x (std 1, bf16), top-k weights in [0.1, 1), and distinct experts per token.
inline RankInputs random_inputs(int T, int H, int K, int E, uint64_t seed,
                                Routing routing = Routing::kUniform, double empty_prob = 0.0,
                                int one_expert = 0) {
  RankInputs in;
  in.T = T;
  in.H = H;
  in.K = K;
  Rng rng(seed);
  in.x.resize(size_t(T) * H);
  for (auto& v : in.x) v = fmt::float_to_bf16(float(rng.normal()));
  in.w.resize(size_t(T) * K);
  for (auto& v : in.w) v = float(0.1 + 0.9 * rng.uniform());
  in.ids.assign(size_t(T) * K, -1);
  std::vector<double> zipf(E);
  double zsum = 0;
  for (int e = 0; e < E; ++e) zsum += (zipf[e] = 1.0 / std::pow(double(e + 1), 1.3));
  for (int t = 0; t < T; ++t) {
    std::vector<int> used;
    for (int k = 0; k < K; ++k) {
      int& id = in.ids[size_t(t) * K + k];
      if (routing == Routing::kAllEmpty) continue;
      if (routing == Routing::kOneExpert && k == 0) {
        id = one_expert;
        used.push_back(id);
        continue;
      }
      if (empty_prob > 0 && rng.uniform() < empty_prob) continue;
      if (int(used.size()) >= E) continue;
      int e;
      do {
        if (routing == Routing::kZipf) {
          double u = rng.uniform() * zsum;
          e = 0;
          while (e + 1 < E && u >= zipf[e]) u -= zipf[e++];
        } else {
          e = rng.below(E);
        }
      } while (std::find(used.begin(), used.end(), e) != used.end());
      used.push_back(e);
      id = e;
    }
  }
  return in;
}

// All ranks' tokens as one rank's input (the W = 1 twin of a W-rank call).
inline RankInputs concat_ranks(const std::vector<RankInputs>& ranks) {
  RankInputs all;
  all.H = ranks.at(0).H;
  all.K = ranks.at(0).K;
  for (const auto& r : ranks) {
    all.T += r.T;
    all.x.insert(all.x.end(), r.x.begin(), r.x.end());
    all.ids.insert(all.ids.end(), r.ids.begin(), r.ids.end());
    all.w.insert(all.w.end(), r.w.begin(), r.w.end());
  }
  return all;
}

// ---------------------------------------------------------------------------------------------
// The independent float64 computation of docs/contract.md §3.1. Dot products, alphas, the
// activation and the top-k sum run in double; only the roundings the spec names are applied: bf16
// g/u (mxfp4_mxfp8), bf16 h (mxfp4_bf16, bf16, nvfp4_bf16), requantized h from the double h cast to
// float (nvfp4, mxfp4_mxfp8), bf16 y and bf16 output. Activations are quantized with the formats.h
// block functions (tested on their own).

struct Reference {
  std::vector<Bits> out;  // per rank, bf16 [T, H]
  std::vector<Bits> y;    // per rank, bf16 [T*K, H]: y[t,k] (0 for an empty slot)
};

inline double dot_d(const float* a, const float* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double(a[i]) * double(b[i]);
    s1 += double(a[i + 1]) * double(b[i + 1]);
    s2 += double(a[i + 2]) * double(b[i + 2]);
    s3 += double(a[i + 3]) * double(b[i + 3]);
  }
  for (; i < n; ++i) s0 += double(a[i]) * double(b[i]);
  return (s0 + s1) + (s2 + s3);
}

// `ranks[r]` holds rank r's inputs with global expert ids; `pack` holds all E experts.
inline Reference reference_forward(const LayerConfig& cfg, const HostPack& pack,
                                   const std::vector<RankInputs>& ranks) {
  const int H = cfg.fleet.hidden_size, I = cfg.recipe.intermediate_size, K = cfg.recipe.top_k;
  const int E = cfg.fleet.num_experts;
  const Recipe recipe = cfg.recipe.recipe;
  const bool topk_in_fc1 = cfg.recipe.apply_topk_in_fc1 || recipe_traits(recipe).topk_in_fc1_forced;
  const double L = cfg.recipe.swiglu_limit ? double(*cfg.recipe.swiglu_limit) : -1.0;
  const double act_alpha = cfg.recipe.swiglu_alpha, act_beta = cfg.recipe.swiglu_beta;
  const bool alphas = recipe_traits(recipe).alphas;  // nvfp4, nvfp4_bf16
  const int W = int(ranks.size());

  // Activations as the fc1 GEMM sees them.
  std::vector<std::vector<float>> xa(W);
  for (int r = 0; r < W; ++r) {
    const auto& in = ranks[r];
    xa[r].resize(size_t(in.T) * H);
    std::vector<uint8_t> q(H), s(H / 16);
    for (int t = 0; t < in.T; ++t) {
      const uint16_t* x = in.x.data() + size_t(t) * H;
      float* o = xa[r].data() + size_t(t) * H;
      if (recipe == Recipe::kNvfp4) {
        fmt::quantize_row_nvfp4(x, H, cfg.recipe.input_norm_const, q.data(), s.data());
        for (int i = 0; i < H; ++i) o[i] = fmt::dequant_nvfp4(q.data(), s.data(), i);
      } else if (recipe == Recipe::kMxfp4Mxfp8) {
        fmt::quantize_row_mxfp8(x, H, q.data(), s.data());
        for (int i = 0; i < H; ++i) o[i] = fmt::dequant_mxfp8(q.data(), s.data(), i);
      } else {
        for (int i = 0; i < H; ++i) o[i] = fmt::bf16_to_float(x[i]);
      }
    }
  }

  struct Job {
    int rank, t, k;
  };
  std::vector<std::vector<Job>> jobs(E);
  for (int r = 0; r < W; ++r)
    for (int t = 0; t < ranks[r].T; ++t)
      for (int k = 0; k < K; ++k) {
        const int e = ranks[r].ids[size_t(t) * K + k];
        if (e >= 0 && e < E) jobs[e].push_back({r, t, k});
      }

  Reference ref;
  ref.out.resize(W);
  ref.y.resize(W);
  for (int r = 0; r < W; ++r) ref.y[r].assign(size_t(ranks[r].T) * K * H, 0);

  std::vector<float> wrow(std::max(H, I));
  for (int e = 0; e < E; ++e) {
    const auto& js = jobs[e];
    const size_t n = js.size();
    if (n == 0) continue;
    std::vector<double> gu(n * 2 * I);
    for (int j = 0; j < 2 * I; ++j) {
      pack.row(true, e, j, wrow.data());
      for (size_t i = 0; i < n; ++i)
        gu[i * 2 * I + j] = dot_d(xa[js[i].rank].data() + size_t(js[i].t) * H, wrow.data(), H);
    }
    // h as the fc2 GEMM sees it.
    std::vector<float> ha(n * I);
    std::vector<float> hf(I);
    std::vector<uint8_t> q(I), s(I / 16);
    for (size_t i = 0; i < n; ++i) {
      const double tw = ranks[js[i].rank].w[size_t(js[i].t) * K + js[i].k];
      for (int j = 0; j < I; ++j) {
        double g = gu[i * 2 * I + j], u = gu[i * 2 * I + I + j];
        if (alphas) {
          g *= double(pack.fc1_alpha[e]);
          u *= double(pack.fc1_alpha[e]);
        }
        if (recipe == Recipe::kMxfp4Mxfp8) {
          g = fmt::round_to_bf16(float(g));
          u = fmt::round_to_bf16(float(u));
        }
        if (!pack.fc1_bias.empty()) {
          g += double(pack.fc1_bias[size_t(e) * 2 * I + j]);
          u += double(pack.fc1_bias[size_t(e) * 2 * I + I + j]);
        }
        if (L >= 0) {
          g = std::min(g, L);
          u = std::clamp(u, -L, L);
        }
        double h = (u + act_beta) * g / (1.0 + std::exp(-act_alpha * g));
        if (topk_in_fc1) h *= tw;
        hf[j] = float(h);
      }
      float* o = ha.data() + i * I;
      if (recipe == Recipe::kNvfp4) {
        fmt::quantize_row_nvfp4(hf.data(), I, pack.fc1_norm_const[e], q.data(), s.data());
        for (int j = 0; j < I; ++j) o[j] = fmt::dequant_nvfp4(q.data(), s.data(), j);
      } else if (recipe == Recipe::kMxfp4Mxfp8) {
        fmt::quantize_row_mxfp8(hf.data(), I, q.data(), s.data());
        for (int j = 0; j < I; ++j) o[j] = fmt::dequant_mxfp8(q.data(), s.data(), j);
      } else {
        for (int j = 0; j < I; ++j) o[j] = fmt::round_to_bf16(hf[j]);
      }
    }
    for (int row = 0; row < H; ++row) {
      pack.row(false, e, row, wrow.data());
      for (size_t i = 0; i < n; ++i) {
        double acc = dot_d(ha.data() + i * I, wrow.data(), I);
        if (alphas) acc *= double(pack.fc2_alpha[e]);
        if (!pack.fc2_bias.empty()) {
          const double tw = ranks[js[i].rank].w[size_t(js[i].t) * K + js[i].k];
          acc += (topk_in_fc1 ? tw : 1.0) * double(pack.fc2_bias[size_t(e) * H + row]);
        }
        ref.y[js[i].rank][(size_t(js[i].t) * K + js[i].k) * H + row] =
            fmt::float_to_bf16(float(acc));
      }
    }
  }
  for (int r = 0; r < W; ++r) {
    const auto& in = ranks[r];
    ref.out[r].assign(size_t(in.T) * H, 0);
    for (int t = 0; t < in.T; ++t)
      for (int o = 0; o < H; ++o) {
        double acc = 0;
        for (int k = 0; k < K; ++k) {
          const int e = in.ids[size_t(t) * K + k];
          if (e < 0) continue;
          const double c = topk_in_fc1 ? 1.0 : double(in.w[size_t(t) * K + k]);
          acc += c * double(fmt::bf16_to_float(ref.y[r][(size_t(t) * K + k) * H + o]));
        }
        ref.out[r][size_t(t) * H + o] = fmt::float_to_bf16(float(acc));
      }
  }
  return ref;
}

// ---------------------------------------------------------------------------------------------
// Comparisons

inline bool is_nan_bf16(uint16_t b) { return (b & 0x7fff) > 0x7f80; }

// ‖a − b‖ / ‖b‖ over bf16 values; NaN in `a` gives +inf.
inline double rel_l2(const Bits& a, const Bits& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (is_nan_bf16(a[i])) return INFINITY;
    const double x = fmt::bf16_to_float(a[i]), y = fmt::bf16_to_float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

// Relative L2 allowed between the CPU backend and reference_forward. bf16 paths (mxfp4_bf16,
// bf16, nvfp4_bf16): fp32 vs double sums flip a bf16 rounding of h or y now and then: 1e-3. nvfp4
// and mxfp4_mxfp8: products of 4-/8-bit operands are exact, so fp32 sums are too, but h is fp32 in
// the backend and double here, and an h on an E2M1/E4M3 rounding midpoint (seen: 15.5 vs
// 15.499999) requantizes one code apart, the one source docs/contract.md §7 allows; at I = 128 a
// single flip moves a rank's output by ~1.5e-3, so these recipes get docs/contract.md §7's 5e-3.
// Tests pair this with bitwise_fraction, which catches a missing or extra rounding step.
inline double reference_tolerance(Recipe r) {
  return (r == Recipe::kNvfp4 || r == Recipe::kMxfp4Mxfp8) ? 5e-3 : 1e-3;
}

// Fraction of elements that are bitwise equal.
inline double bitwise_fraction(const Bits& a, const Bits& b) {
  if (a.size() != b.size()) return 0.0;
  if (a.empty()) return 1.0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return double(same) / double(a.size());
}

inline size_t count_nan(const Bits& a) {
  return size_t(std::count_if(a.begin(), a.end(), is_nan_bf16));
}

// Empty string when bitwise equal; otherwise where they first differ and how often.
inline std::string bitwise_diff(const Bits& got, const Bits& want, int H) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  size_t first = got.size(), count = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      if (first == got.size()) first = i;
      ++count;
    }
  if (count == 0) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "%zu of %zu elements differ; first at token %zu col %zu: got 0x%04x (%g), want "
                "0x%04x (%g)",
                count, got.size(), first / H, first % H, got[first],
                double(fmt::bf16_to_float(got[first])), want[first],
                double(fmt::bf16_to_float(want[first])));
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Running a sequence of calls on one layer per rank.

enum class OutMode {
  kCaller,      // forward(in, out) into poisoned caller memory
  kOwned,       // Tensor forward(in)
  kView,        // forward_view(in); the previous call's view is poisoned first
  kUnfinalized  // forward_unfinalized(in), summed in slot order here (layer: do_finalize=false)
};

inline const char* out_mode_name(OutMode m) {
  switch (m) {
    case OutMode::kCaller:
      return "caller";
    case OutMode::kOwned:
      return "owned";
    case OutMode::kView:
      return "view";
    case OutMode::kUnfinalized:
      return "unfinalized";
  }
  return "?";
}

// docs/contract.md §3 finalize of an unfinalized output: fp32, separate multiply and add, slot
// order.
inline Bits sum_unfinalized(const UnfinalizedOutput& u, const RankInputs& in) {
  const int T = in.T, K = in.K, H = in.H;
  Bits out(size_t(T) * H);
  const auto* rows = u.rows.ptr<uint16_t>();
  const auto* w = u.weights.ptr<float>();
  const auto* idx = u.indices.ptr<int32_t>();
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < H; ++o) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) {
        if (in.ids[size_t(t) * K + k] < 0) continue;
        const float y = fmt::bf16_to_float(rows[size_t(idx[t * K + k]) * H + o]);
        acc = fmt::add_rn(acc, fmt::mul_rn(w[t * K + k], y));
      }
      out[size_t(t) * H + o] = fmt::float_to_bf16(acc);
    }
  return out;
}

struct FleetSetup {
  int world = 1;
  LayerConfig cfg;
  const HostPack* pack = nullptr;
  int64_t timeout_ms = 30000;
  int omp_threads = 0;  // > 0: omp_set_num_threads in every rank thread
};

inline void set_omp_threads(int n) { omp_set_num_threads(n); }

// calls[c][r]: rank r's inputs of call c. Returns out[c][r] (bf16 [T, H]).
inline std::vector<std::vector<Bits>> run_calls(const FleetSetup& s,
                                                const std::vector<std::vector<RankInputs>>& calls,
                                                OutMode mode) {
  const int W = s.world;
  const int El = s.cfg.fleet.num_experts / W;
  const int H = s.cfg.fleet.hidden_size;
  std::vector<std::vector<Bits>> outs(calls.size(), std::vector<Bits>(W));
  auto fleet = W > 1 ? make_cpu_fleet(W) : nullptr;
  run_fleet(W, [&](int r) {
    if (s.omp_threads > 0) set_omp_threads(s.omp_threads);
    Bootstrap b;
    b.world_size = W;
    b.rank = r;
    b.backend = Backend::kCPU;
    b.cpu_fleet = fleet;
    b.timeout_ms = s.timeout_ms;
    LayerConfig cfg = s.cfg;
    if (mode == OutMode::kUnfinalized) cfg.recipe.do_finalize = false;
    MegaLayer layer(b, cfg, s.pack->view(r * El, El), s.pack->epilogue_view(r * El, El));
    TensorView prev_view;
    for (size_t c = 0; c < calls.size(); ++c) {
      const RankInputs& in = calls[c][r];
      ForwardInputs fi = in.forward_inputs();
      Bits& out = outs[c][r];
      switch (mode) {
        case OutMode::kCaller: {
          out.assign(size_t(in.T) * H, kPoison);
          layer.forward(fi, TensorView::contiguous(out.data(), DType::kBF16, {in.T, H}));
          break;
        }
        case OutMode::kOwned: {
          Tensor t = layer.forward(fi);
          const auto* p = t.ptr<uint16_t>();
          out.assign(p, p + size_t(in.T) * H);
          break;
        }
        case OutMode::kView: {
          if (prev_view.defined() && prev_view.data)
            std::fill_n(prev_view.ptr<uint16_t>(), prev_view.numel(), kPoison);
          TensorView v = layer.forward_view(fi);
          const auto* p = v.ptr<uint16_t>();
          out.assign(p, p + size_t(in.T) * H);
          prev_view = v;
          break;
        }
        case OutMode::kUnfinalized: {
          UnfinalizedOutput u = layer.forward_unfinalized(fi);
          out = sum_unfinalized(u, in);
          break;
        }
      }
    }
    layer.destroy();
  });
  return outs;
}

// Splits a W = 1 output back into per-rank pieces of `ranks`' token counts.
inline std::vector<Bits> split_rows(const Bits& all, const std::vector<RankInputs>& ranks) {
  std::vector<Bits> out;
  size_t off = 0;
  for (const auto& r : ranks) {
    const size_t n = size_t(r.T) * r.H;
    out.emplace_back(all.begin() + off, all.begin() + off + n);
    off += n;
  }
  return out;
}

inline LayerConfig make_config(Recipe recipe, int E, int capacity, int H, int I, int K) {
  LayerConfig c;
  c.fleet.num_experts = E;
  c.fleet.max_tokens_per_rank = capacity;
  c.fleet.hidden_size = H;
  c.recipe.recipe = recipe;
  c.recipe.intermediate_size = I;
  c.recipe.top_k = K;
  return c;
}

}  // namespace moe_ep::test
