// pack_expert_weights: shapes and views, dequantized round-trip bounds per recipe, and the nvfp4
// alphas (alpha * acc must be the true dot product).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "moe_ep/formats.h"
#include "moe_ep/status.h"
#include "moe_ep/weight_prep.h"

namespace moe_ep {
namespace {

struct Master {
  int E, H, I;
  std::vector<float> w13, w2;
};

Master random_master(int E, int H, int I, uint32_t seed) {
  Master m{E, H, I, std::vector<float>(size_t(E) * 2 * I * H),
           std::vector<float>(size_t(E) * H * I)};
  std::mt19937 rng(seed);
  for (int e = 0; e < E; ++e) {
    // Experts of very different magnitude, so the per-expert global scales differ.
    std::normal_distribution<float> nd(0.0f, std::ldexp(1.0f, 3 * e - 4));
    for (int64_t i = 0; i < int64_t(2) * I * H; ++i) m.w13[e * size_t(2) * I * H + i] = nd(rng);
    for (int64_t i = 0; i < int64_t(H) * I; ++i) m.w2[e * size_t(H) * I + i] = nd(rng);
  }
  return m;
}

float max_abs(const float* x, int64_t n) {
  float a = 0;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

// Dequantized weight element (global scale not applied) of a 4-bit pack.
float deq(Recipe r, const uint8_t* data, const uint8_t* scales, int64_t i) {
  return recipe_traits(r).e4m3_scales ? fmt::dequant_nvfp4(data, scales, int(i))
                                      : fmt::dequant_mxfp4(data, scales, int(i));
}

TEST(WeightPrep, ShapesAndViews) {
  const int E = 4, H = 64, I = 96;
  const Master m = random_master(E, H, I, 1);
  for (Recipe r : kAllRecipes) {
    SCOPED_TRACE(recipe_name(r));
    const PackedExperts p = pack_expert_weights(r, m.w13.data(), m.w2.data(), E, H, I);
    EXPECT_EQ(p.num_experts, E);
    EXPECT_EQ(p.fc1_alpha.size(), size_t(E));
    const RecipeTraits t = recipe_traits(r);
    const WeightPack all = p.view();
    const WeightPack part = p.view(1, 2);
    if (t.weights_4bit) {
      const int g = t.weight_block;
      EXPECT_EQ(p.w13.size(), size_t(E) * 2 * I * H / 2);
      EXPECT_EQ(p.w2_scale.size(), size_t(E) * H * I / g);
      EXPECT_EQ(all.w13.describe(),
                TensorView::contiguous(nullptr, DType::kU8, {E, 2 * I, H / 2}).describe());
      EXPECT_EQ(all.w13.dtype, DType::kU8);
      EXPECT_EQ(all.w2.shape[1], H);
      EXPECT_EQ(all.w2.shape[2], I / 2);
      EXPECT_EQ(all.w13_scale.shape[2], H / g);
      EXPECT_EQ(all.w2_scale.shape[2], I / g);
      EXPECT_EQ(all.w2_scale.dtype, DType::kU8);
      EXPECT_EQ(part.w13.shape[0], 2);
      EXPECT_EQ(part.w13.ptr<uint8_t>(), p.w13.data() + size_t(2) * I * H / 2);
      EXPECT_EQ(part.w2_scale.ptr<uint8_t>(), p.w2_scale.data() + size_t(H) * I / g);
      EXPECT_TRUE(part.w13_scale.is_contiguous());
    } else {
      EXPECT_EQ(p.w13.size(), size_t(E) * 2 * I * H * 2);
      EXPECT_TRUE(p.w13_scale.empty());
      EXPECT_EQ(all.w13.dtype, DType::kBF16);
      EXPECT_EQ(all.w13.shape[2], H);
      EXPECT_EQ(all.w2.shape[2], I);
      EXPECT_FALSE(all.w13_scale.defined());
      EXPECT_FALSE(all.w2_scale.defined());
      EXPECT_EQ(part.w2.ptr<uint8_t>(), p.w2.data() + size_t(H) * I * 2);
    }
    const EpilogueVectors ev = p.epilogue_view(3);
    EXPECT_EQ(ev.fc1_alpha.dtype, DType::kF32);
    EXPECT_EQ(ev.fc2_alpha.shape[0], 1);
    EXPECT_EQ(ev.fc1_norm_const.ptr<float>(), p.fc1_norm_const.data() + 3);
    EXPECT_THROW(p.view(3, 2), Error);
    EXPECT_THROW(p.epilogue_view(-1), Error);
  }
}

TEST(WeightPrep, Bf16IsRoundedMaster) {
  const int E = 2, H = 32, I = 48;
  const Master m = random_master(E, H, I, 2);
  const PackedExperts p = pack_expert_weights(Recipe::kBf16, m.w13.data(), m.w2.data(), E, H, I);
  for (size_t i = 0; i < m.w13.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, p.w13.data() + 2 * i, 2);
    ASSERT_EQ(b, fmt::float_to_bf16(m.w13[i])) << i;
  }
  for (size_t i = 0; i < m.w2.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, p.w2.data() + 2 * i, 2);
    // Round to nearest with 8 significant bits: relative error at most 2^-8.
    ASSERT_LE(std::fabs(fmt::bf16_to_float(b) - m.w2[i]), std::ldexp(std::fabs(m.w2[i]), -8));
  }
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(p.fc1_alpha[e], 1.0f);
    EXPECT_EQ(p.fc2_alpha[e], 1.0f);
  }
}

// Per-element bound of E2M1 with a block scale s that does not let the block saturate by more
// than the E4M3 rounding of the scale: |deq - w| <= max(|w| / 4, s / 4). (E2M1 steps are 0.5 below
// 2, then 1 and 2: half a step is at most a quarter of the value for |q| >= 1.) For nvfp4, s and
// deq are in units of the global scale; the check multiplies them back.
void check_elements(Recipe r, const float* w, const uint8_t* data, const uint8_t* scales, int64_t n,
                    int g, float gs) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = recipe_traits(r).e4m3_scales ? fmt::e4m3_to_float(scales[i / g])
                                                 : fmt::ue8m0_to_float(scales[i / g]);
    const double d = double(deq(r, data, scales, i)) * gs;
    const double bound = std::max(std::fabs(w[i]) / 4.0, double(s) * gs / 4.0);
    ASSERT_LE(std::fabs(d - w[i]), bound * (1 + 1e-6)) << "element " << i << " w " << w[i];
  }
}

TEST(WeightPrep, Mxfp4RoundTrip) {
  const int E = 3, H = 128, I = 64;
  const Master m = random_master(E, H, I, 3);
  for (Recipe r : {Recipe::kMxfp4Mxfp8, Recipe::kMxfp4Bf16}) {
    const PackedExperts p = pack_expert_weights(r, m.w13.data(), m.w2.data(), E, H, I);
    check_elements(r, m.w13.data(), p.w13.data(), p.w13_scale.data(), int64_t(m.w13.size()), 32,
                   1.0f);
    check_elements(r, m.w2.data(), p.w2.data(), p.w2_scale.data(), int64_t(m.w2.size()), 32, 1.0f);
    // Each scale is the smallest power of two that keeps the block within +-6.
    for (size_t b = 0; b < p.w13_scale.size(); ++b) {
      const float amax = max_abs(m.w13.data() + 32 * b, 32);
      const float s = fmt::ue8m0_to_float(p.w13_scale[b]);
      ASSERT_LE(amax / s, 6.0f);
      ASSERT_GT(amax / s, 3.0f);
    }
    for (int e = 0; e < E; ++e) EXPECT_EQ(p.fc1_alpha[e], 1.0f);
  }
}

TEST(WeightPrep, Nvfp4GlobalScalesAndAlphas) {
  const int E = 3, H = 128, I = 64;
  const Master m = random_master(E, H, I, 4);
  const float input_nc = 3.0f;
  const std::vector<float> fc1_nc = {0.5f, 2.0f, 7.0f};
  const PackedExperts p = pack_expert_weights(Recipe::kNvfp4, m.w13.data(), m.w2.data(), E, H, I,
                                              input_nc, fc1_nc.data());
  const int64_t n13 = int64_t(2) * I * H, n2 = int64_t(H) * I;
  for (int e = 0; e < E; ++e) {
    SCOPED_TRACE(e);
    const float gs13 = max_abs(m.w13.data() + e * n13, n13) / 2688.0f;
    const float gs2 = max_abs(m.w2.data() + e * n2, n2) / 2688.0f;
    EXPECT_FLOAT_EQ(p.fc1_alpha[e], gs13 / input_nc);
    EXPECT_FLOAT_EQ(p.fc2_alpha[e], gs2 / fc1_nc[e]);
    EXPECT_EQ(p.fc1_norm_const[e], fc1_nc[e]);
    const uint8_t* s13 = p.w13_scale.data() + e * n13 / 16;
    // The global scale puts the largest block scale on the top of the E4M3 range.
    uint8_t top = 0;
    for (int64_t b = 0; b < n13 / 16; ++b) top = std::max<uint8_t>(top, s13[b] & 0x7f);
    EXPECT_EQ(top, 0x7e);
    check_elements(Recipe::kNvfp4, m.w13.data() + e * n13, p.w13.data() + e * n13 / 2, s13, n13, 16,
                   gs13);
    check_elements(Recipe::kNvfp4, m.w2.data() + e * n2, p.w2.data() + e * n2 / 2,
                   p.w2_scale.data() + e * n2 / 16, n2, 16, gs2);

    // alpha * acc is the dot product: quantize an activation row with input_nc as docs/contract.md
    // §3.1 step 1 does and compare with the exact dot of the master values.
    std::mt19937 rng(10 + e);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(H);
    for (float& v : x) v = nd(rng);
    std::vector<uint8_t> xq(H / 2), xs(H / 16);
    fmt::quantize_row_nvfp4(x.data(), H, input_nc, xq.data(), xs.data());
    double worst = 0;
    for (int row = 0; row < 2 * I; ++row) {
      const float* w = m.w13.data() + e * n13 + int64_t(row) * H;
      const uint8_t* wq = p.w13.data() + e * n13 / 2 + int64_t(row) * H / 2;
      const uint8_t* ws = s13 + int64_t(row) * H / 16;
      double acc = 0, exact = 0, norm = 0;
      for (int k = 0; k < H; ++k) {
        acc += double(fmt::dequant_nvfp4(xq.data(), xs.data(), k)) * fmt::dequant_nvfp4(wq, ws, k);
        exact += double(x[k]) * w[k];
        norm += std::fabs(double(x[k]) * w[k]);
      }
      worst = std::max(worst, std::fabs(acc * p.fc1_alpha[e] - exact) / norm);
    }
    // Each factor is within ~1/4 of itself at worst, ~9% on average for Gaussian data.
    EXPECT_LT(worst, 0.25) << "alpha does not undo the global and input scales";
    EXPECT_GT(worst, 0.0);
  }
}

// nvfp4_bf16 packs the weights exactly as nvfp4 does (the same global scales and block codes),
// but neither x nor h is quantized: the alphas are the global scales themselves whatever
// input_norm_const and fc1_norm_const say, the norm constants stay 1, and alpha * acc with bf16
// activations is the dot product of the master values.
TEST(WeightPrep, Nvfp4Bf16AlphasAreTheGlobalScales) {
  const int E = 3, H = 128, I = 64;
  const Master m = random_master(E, H, I, 7);
  const std::vector<float> fc1_nc = {0.5f, 2.0f, 7.0f};
  const PackedExperts p = pack_expert_weights(Recipe::kNvfp4Bf16, m.w13.data(), m.w2.data(), E, H,
                                              I, 3.0f, fc1_nc.data());
  const PackedExperts nv =
      pack_expert_weights(Recipe::kNvfp4, m.w13.data(), m.w2.data(), E, H, I, 3.0f, fc1_nc.data());
  EXPECT_EQ(p.w13, nv.w13);
  EXPECT_EQ(p.w2, nv.w2);
  EXPECT_EQ(p.w13_scale, nv.w13_scale);
  EXPECT_EQ(p.w2_scale, nv.w2_scale);
  const int64_t n13 = int64_t(2) * I * H, n2 = int64_t(H) * I;
  for (int e = 0; e < E; ++e) {
    SCOPED_TRACE(e);
    const float gs13 = max_abs(m.w13.data() + e * n13, n13) / 2688.0f;
    const float gs2 = max_abs(m.w2.data() + e * n2, n2) / 2688.0f;
    EXPECT_FLOAT_EQ(p.fc1_alpha[e], gs13);
    EXPECT_FLOAT_EQ(p.fc2_alpha[e], gs2);
    EXPECT_EQ(p.fc1_norm_const[e], 1.0f);
    std::mt19937 rng(20 + e);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(H);
    for (float& v : x) v = fmt::bf16_to_float(fmt::float_to_bf16(nd(rng)));
    double worst = 0;
    for (int row = 0; row < 2 * I; ++row) {
      const float* w = m.w13.data() + e * n13 + int64_t(row) * H;
      const uint8_t* wq = p.w13.data() + e * n13 / 2 + int64_t(row) * H / 2;
      const uint8_t* ws = p.w13_scale.data() + e * n13 / 16 + int64_t(row) * H / 16;
      double acc = 0, exact = 0, norm = 0;
      for (int k = 0; k < H; ++k) {
        acc += double(x[k]) * fmt::dequant_nvfp4(wq, ws, k);
        exact += double(x[k]) * w[k];
        norm += std::fabs(double(x[k]) * w[k]);
      }
      worst = std::max(worst, std::fabs(acc * p.fc1_alpha[e] - exact) / norm);
    }
    EXPECT_LT(worst, 0.25) << "alpha does not undo the global scale";
    EXPECT_GT(worst, 0.0);
  }
}

// dequantize_expert gives every packed value times its block scale (no alphas), for every 4-bit
// recipe; bad expert indices are refused.
TEST(WeightPrep, DequantizeExpertIsCodeTimesScale) {
  const int E = 2, H = 64, I = 32;
  const Master m = random_master(E, H, I, 8);
  for (Recipe r : {Recipe::kNvfp4, Recipe::kMxfp4Mxfp8, Recipe::kMxfp4Bf16, Recipe::kNvfp4Bf16}) {
    SCOPED_TRACE(recipe_name(r));
    const PackedExperts p = pack_expert_weights(r, m.w13.data(), m.w2.data(), E, H, I);
    std::vector<float> w13(size_t(2) * I * H), w2(size_t(H) * I);
    for (int e = 0; e < E; ++e) {
      dequantize_expert(p, e, w13.data(), w2.data());
      const int64_t n13 = int64_t(w13.size()), n2 = int64_t(w2.size());
      const int g = recipe_traits(r).weight_block;
      for (int64_t i = 0; i < n13; ++i)
        ASSERT_EQ(w13[i], deq(r, p.w13.data() + e * n13 / 2, p.w13_scale.data() + e * n13 / g, i))
            << "w13 " << i;
      for (int64_t i = 0; i < n2; ++i)
        ASSERT_EQ(w2[i], deq(r, p.w2.data() + e * n2 / 2, p.w2_scale.data() + e * n2 / g, i))
            << "w2 " << i;
    }
    EXPECT_THROW(dequantize_expert(p, E, w13.data(), w2.data()), Error);
  }
}

TEST(WeightPrep, Nvfp4ZeroExpertAndDefaults) {
  const int E = 2, H = 32, I = 32;
  Master m = random_master(E, H, I, 5);
  std::fill(m.w13.begin(), m.w13.begin() + 2 * I * H, 0.0f);  // expert 0's w13 all zero
  const PackedExperts p = pack_expert_weights(Recipe::kNvfp4, m.w13.data(), m.w2.data(), E, H, I);
  EXPECT_EQ(p.fc1_alpha[0], 1.0f);  // gs = 1 when amax is 0, input_norm_const 1
  EXPECT_EQ(p.fc1_norm_const[1], 1.0f);
  for (int64_t i = 0; i < 2 * I * H / 2; ++i) ASSERT_EQ(p.w13[i], 0);
  for (int64_t i = 0; i < 2 * I * H / 16; ++i) ASSERT_EQ(p.w13_scale[i], 0);
}

TEST(WeightPrep, RejectsBadInput) {
  const int E = 1, H = 32, I = 32;
  Master m = random_master(E, H, I, 6);
  EXPECT_THROW(pack_expert_weights(Recipe::kNvfp4, m.w13.data(), m.w2.data(), E, 24, I), Error);
  EXPECT_THROW(pack_expert_weights(Recipe::kMxfp4Bf16, m.w13.data(), m.w2.data(), E, H, 16), Error);
  EXPECT_THROW(pack_expert_weights(Recipe::kBf16, m.w13.data(), m.w2.data(), 0, H, I), Error);
  EXPECT_THROW(pack_expert_weights(Recipe::kNvfp4, m.w13.data(), m.w2.data(), E, H, I, 0.0f),
               Error);
  m.w2[5] = NAN;
  try {
    pack_expert_weights(Recipe::kMxfp4Mxfp8, m.w13.data(), m.w2.data(), E, H, I);
    FAIL() << "NaN weight accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("w2 of expert 0"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace moe_ep
