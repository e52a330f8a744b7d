#include "reference/cpu_math.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "moe_ep/formats.h"
#include "moe_ep/status.h"
#include "moe_ep/weight_prep.h"

namespace moe_ep {
namespace {

using fmt::kMxBlock;
using fmt::kNvfp4Block;

typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The one lane reduction of every dot product.
inline float hsum(v8 v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// R weight rows x C activation rows, each dot accumulated lane-wise in i order (no FMA: the
// build has -ffp-contract=off), so the result is the same as dot_fixed of each pair.
template <int R, int C>
inline void dot_block(const float* const* w, const float* const* x, int n, float* out,
                      int out_stride) {
  v8 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = v8{};
  for (int i = 0; i < n; i += 8) {
    v8 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = load8(x[c] + i);
    for (int r = 0; r < R; ++r) {
      const v8 wv = load8(w[r] + i);
      for (int c = 0; c < C; ++c) acc[r][c] += wv * xv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[c * out_stride + r] = hsum(acc[r][c]);
}

// out[p * out_stride + r] = dot(w_rows[r], x_rows[p]) for r < R (4), all p.
void dots_4rows(const float* const* w, const std::vector<const float*>& x, int n, float* out,
                int out_stride) {
  const int P = int(x.size());
  int p = 0;
  for (; p + 2 <= P; p += 2) dot_block<4, 2>(w, &x[p], n, out + size_t(p) * out_stride, out_stride);
  for (; p < P; ++p) dot_block<4, 1>(w, &x[p], n, out + size_t(p) * out_stride, out_stride);
}

// Both E2M1 values of every packed byte, and every E4M3 / UE8M0 byte's value.
struct DecodeTables {
  float e2m1_pair[256][2];
  float e4m3[256];
  float ue8m0[256];
  DecodeTables() {
    for (int b = 0; b < 256; ++b) {
      e2m1_pair[b][0] = fmt::e2m1_to_float(uint8_t(b & 0xf));
      e2m1_pair[b][1] = fmt::e2m1_to_float(uint8_t(b >> 4));
      e4m3[b] = fmt::e4m3_to_float(uint8_t(b));
      ue8m0[b] = fmt::ue8m0_to_float(uint8_t(b));
    }
  }
};
const DecodeTables& tables() {
  static const DecodeTables t;
  return t;
}

// n 4-bit values (packed) times their block scales (scale values given per block).
inline void dequant_4bit(const uint8_t* q, const uint8_t* s, const float* scale_table, int block,
                         int n, float* out) {
  const auto& pair = tables().e2m1_pair;
  for (int b = 0; b < n / block; ++b) {
    const float sc = scale_table[s[b]];
    for (int i = 0; i < block / 2; ++i) {
      const uint8_t byte = q[b * block / 2 + i];
      out[b * block + 2 * i] = pair[byte][0] * sc;
      out[b * block + 2 * i + 1] = pair[byte][1] * sc;
    }
  }
}

}  // namespace

float dot_fixed(const float* a, const float* b, int n) {
  v8 acc{};
  for (int i = 0; i < n; i += 8) acc += load8(b + i) * load8(a + i);
  return hsum(acc);
}

ActFormat act_format(Recipe r, int H) {
  switch (r) {
    case Recipe::kNvfp4:
      return {H / 2, H / kNvfp4Block};
    case Recipe::kMxfp4Mxfp8:
      return {H, H / kMxBlock};
    case Recipe::kMxfp4Bf16:
    case Recipe::kBf16:
    case Recipe::kNvfp4Bf16:
      return {2 * H, 0};
  }
  return {};
}

void encode_activation(const RecipeConfig& rc, const ActFormat& f, const uint16_t* x, int H,
                       uint8_t* row) {
  switch (rc.recipe) {
    case Recipe::kNvfp4:
      fmt::quantize_row_nvfp4(x, H, rc.input_norm_const, row, row + f.data_bytes);
      break;
    case Recipe::kMxfp4Mxfp8:
      fmt::quantize_row_mxfp8(x, H, row, row + f.data_bytes);
      break;
    case Recipe::kMxfp4Bf16:
    case Recipe::kBf16:
    case Recipe::kNvfp4Bf16:
      std::memcpy(row, x, size_t(H) * 2);
      break;
  }
}

void decode_activation(Recipe r, const ActFormat& f, const uint8_t* row, int H, float* out) {
  switch (r) {
    case Recipe::kNvfp4:
      dequant_4bit(row, row + f.data_bytes, tables().e4m3, kNvfp4Block, H, out);
      break;
    case Recipe::kMxfp4Mxfp8: {
      const auto& t = tables();
      for (int i = 0; i < H; ++i)
        out[i] = t.e4m3[row[i]] * t.ue8m0[row[f.data_bytes + i / kMxBlock]];
      break;
    }
    case Recipe::kMxfp4Bf16:
    case Recipe::kBf16:
    case Recipe::kNvfp4Bf16: {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(row);
      for (int i = 0; i < H; ++i) out[i] = fmt::bf16_to_float(x[i]);
      break;
    }
  }
}

bool applies_weight_in_fc1(const RecipeConfig& rc) {
  return rc.apply_topk_in_fc1 || recipe_traits(rc.recipe).topk_in_fc1_forced;
}

namespace {

// Row `row` of a [rows, n] matrix in the recipe's weight format, as fp32.
void dequant_weight_row(Recipe r, const uint8_t* data, const uint8_t* scales, size_t row, int n,
                        float* out) {
  switch (r) {
    case Recipe::kNvfp4:
    case Recipe::kNvfp4Bf16:
      dequant_4bit(data + row * (n / 2), scales + row * (n / kNvfp4Block), tables().e4m3,
                   kNvfp4Block, n, out);
      break;
    case Recipe::kMxfp4Mxfp8:
    case Recipe::kMxfp4Bf16:
      dequant_4bit(data + row * (n / 2), scales + row * (n / kMxBlock), tables().ue8m0, kMxBlock, n,
                   out);
      break;
    case Recipe::kBf16: {
      const uint16_t* q = reinterpret_cast<const uint16_t*>(data) + row * n;
      for (int i = 0; i < n; ++i) out[i] = fmt::bf16_to_float(q[i]);
      break;
    }
  }
}

}  // namespace

void dequant_fc1_row(Recipe r, const ExpertShape& s, const ExpertWeights& w, int e, int j,
                     float* out) {
  dequant_weight_row(r, w.w13, w.w13_scale, size_t(e) * 2 * s.I + j, s.H, out);
}

void dequant_fc2_row(Recipe r, const ExpertShape& s, const ExpertWeights& w, int e, int j,
                     float* out) {
  dequant_weight_row(r, w.w2, w.w2_scale, size_t(e) * s.H + j, s.I, out);
}

void run_experts(const LayerConfig& cfg, const ExpertShape& s, const ExpertWeights& w,
                 const EpilogueParams& ep, const std::vector<std::vector<Pair>>& pairs,
                 bool weight_in_fc1, int threads,
                 const std::function<uint16_t*(const Pair&)>& out_row) {
  const Recipe recipe = cfg.recipe.recipe;
  const int H = s.H, I = s.I, El = s.El;
  const ActFormat act = act_format(recipe, H);
  const float limit = cfg.recipe.swiglu_limit ? *cfg.recipe.swiglu_limit : -1.0f;
  const float act_alpha = cfg.recipe.swiglu_alpha, act_beta = cfg.recipe.swiglu_beta;
  // The NVFP4 recipes' per-expert fc1 / fc2 alphas (nvfp4, nvfp4_bf16).
  const bool alphas = recipe_traits(recipe).alphas;
  constexpr int kRows = 4;  // weight rows per task (the micro-kernel's R)

  // Decoded activations X [n_e, H] and fc1 results A [n_e, 2I] per expert.
  std::vector<std::vector<float>> X(El), A(El), Hh(El);
  std::vector<std::pair<int, int>> x_tasks;  // (expert, pair)
  for (int e = 0; e < El; ++e) {
    const size_t n = pairs[e].size();
    if (!n) continue;
    X[e].resize(n * H);
    A[e].resize(n * 2 * I);
    Hh[e].resize(n * I);
    for (size_t p = 0; p < n; ++p) x_tasks.push_back({e, int(p)});
  }
  if (x_tasks.empty()) return;

#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < x_tasks.size(); ++i) {
    const auto [e, p] = x_tasks[i];
    decode_activation(recipe, act, pairs[e][p].act, H, X[e].data() + size_t(p) * H);
  }

  // fc1: tasks of kRows weight rows of one expert; each weight row is dequantized once and
  // used for every token routed to the expert.
  std::vector<std::pair<int, int>> tasks1;
  for (int e = 0; e < El; ++e)
    if (!pairs[e].empty())
      for (int j = 0; j < 2 * I; j += kRows) tasks1.push_back({e, j});
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> tile(size_t(kRows) * std::max(H, I));
    std::vector<const float*> xr;
#pragma omp for schedule(dynamic, 4)
    for (size_t ti = 0; ti < tasks1.size(); ++ti) {
      const auto [e, j0] = tasks1[ti];
      const float* wr[kRows];
      for (int r = 0; r < kRows; ++r) {
        dequant_fc1_row(recipe, s, w, e, j0 + r, tile.data() + size_t(r) * H);
        wr[r] = tile.data() + size_t(r) * H;
      }
      xr.clear();
      for (size_t p = 0; p < pairs[e].size(); ++p) xr.push_back(X[e].data() + p * H);
      dots_4rows(wr, xr, H, A[e].data() + j0, 2 * I);
    }
  }

  // Epilogue of fc1: scale, activation, top-k weight, the recipe's rounding of h.
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> h(I);
    std::vector<uint8_t> q(I), sc(I / 16 + 1);
#pragma omp for schedule(static)
    for (size_t i = 0; i < x_tasks.size(); ++i) {
      const auto [e, p] = x_tasks[i];
      const float* a = A[e].data() + size_t(p) * 2 * I;
      float* out = Hh[e].data() + size_t(p) * I;
      const float tw = pairs[e][p].topk_weight;
      for (int c = 0; c < I; ++c) {
        float g = a[c], u = a[I + c];
        if (alphas) {
          g = fmt::mul_rn(ep.fc1_alpha[e], g);
          u = fmt::mul_rn(ep.fc1_alpha[e], u);
        } else if (recipe == Recipe::kMxfp4Mxfp8) {
          g = fmt::round_to_bf16(g);
          u = fmt::round_to_bf16(u);
        }
        if (ep.fc1_bias) {
          const float* b = ep.fc1_bias + size_t(e) * 2 * I;
          g = fmt::add_rn(g, b[c]);
          u = fmt::add_rn(u, b[I + c]);
        }
        float hv = fmt::swiglu_ab(g, u, limit, act_alpha, act_beta);
        if (weight_in_fc1) hv = fmt::mul_rn(hv, tw);
        h[c] = hv;
      }
      switch (recipe) {
        case Recipe::kNvfp4:
          fmt::quantize_row_nvfp4(h.data(), I, ep.fc1_norm_const[e], q.data(), sc.data());
          for (int c = 0; c < I; ++c) out[c] = fmt::dequant_nvfp4(q.data(), sc.data(), c);
          break;
        case Recipe::kMxfp4Mxfp8:
          fmt::quantize_row_mxfp8(h.data(), I, q.data(), sc.data());
          for (int c = 0; c < I; ++c) out[c] = fmt::dequant_mxfp8(q.data(), sc.data(), c);
          break;
        case Recipe::kMxfp4Bf16:
        case Recipe::kBf16:
        case Recipe::kNvfp4Bf16:
          for (int c = 0; c < I; ++c) out[c] = fmt::round_to_bf16(h[c]);
          break;
      }
    }
  }

  // fc2: tasks of kRows output columns of one expert; y goes straight to the combine rows.
  std::vector<std::pair<int, int>> tasks2;
  for (int e = 0; e < El; ++e)
    if (!pairs[e].empty())
      for (int j = 0; j < H; j += kRows) tasks2.push_back({e, j});
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> tile(size_t(kRows) * I), y;
    std::vector<const float*> hr;
#pragma omp for schedule(dynamic, 4)
    for (size_t ti = 0; ti < tasks2.size(); ++ti) {
      const auto [e, j0] = tasks2[ti];
      const float* wr[kRows];
      for (int r = 0; r < kRows; ++r) {
        dequant_fc2_row(recipe, s, w, e, j0 + r, tile.data() + size_t(r) * I);
        wr[r] = tile.data() + size_t(r) * I;
      }
      const size_t n = pairs[e].size();
      hr.clear();
      for (size_t p = 0; p < n; ++p) hr.push_back(Hh[e].data() + p * I);
      y.resize(n * kRows);
      dots_4rows(wr, hr, I, y.data(), kRows);
      const float alpha = alphas ? ep.fc2_alpha[e] : 1.0f;
      const float* b2 = ep.fc2_bias ? ep.fc2_bias + size_t(e) * H + j0 : nullptr;
      for (size_t p = 0; p < n; ++p) {
        uint16_t* o = out_row(pairs[e][p]) + j0;
        const float tw = pairs[e][p].topk_weight;
        for (int r = 0; r < kRows; ++r) {
          float v = y[p * kRows + r];
          if (alphas) v = fmt::mul_rn(alpha, v);
          if (b2) v = fmt::add_rn(v, weight_in_fc1 ? fmt::mul_rn(tw, b2[r]) : b2[r]);
          o[r] = fmt::float_to_bf16(v);
        }
      }
    }
  }
}

void finalize_token(const uint16_t* rows, const int32_t* ids, const float* weights, int K, int H,
                    bool weight_in_fc1, uint16_t* out) {
  for (int i = 0; i < H; ++i) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
      if (ids[k] < 0) continue;
      const float c = weight_in_fc1 ? 1.0f : weights[k];
      acc = fmt::add_rn(acc, fmt::mul_rn(c, fmt::bf16_to_float(rows[size_t(k) * H + i])));
    }
    out[i] = fmt::float_to_bf16(acc);
  }
}

void dequantize_expert(const PackedExperts& p, int expert, float* w13, float* w2) {
  if (expert < 0 || expert >= p.num_experts)
    throw Error(ErrorCode::kInvalidArgument, "dequantize_expert: expert " + std::to_string(expert) +
                                                 " is outside [0, " +
                                                 std::to_string(p.num_experts) + ")");
  const ExpertShape s{p.hidden, p.inter, 1, p.num_experts};
  const ExpertWeights w{p.w13.data(), p.w2.data(), p.w13_scale.data(), p.w2_scale.data()};
  for (int j = 0; j < 2 * p.inter; ++j)
    dequant_fc1_row(p.recipe, s, w, expert, j, w13 + size_t(j) * p.hidden);
  for (int j = 0; j < p.hidden; ++j)
    dequant_fc2_row(p.recipe, s, w, expert, j, w2 + size_t(j) * p.inter);
}

}  // namespace moe_ep
